"""Primitives against published vectors and against independent pure-Python code."""

import hashlib
import hmac
import os
import struct

from hypothesis import given, settings, strategies as st

import pytest

from anex_agent.errors import RemoteProtocolError
from anex_agent.wg import crypto


def _rotl(v, c):
    return ((v << c) & 0xFFFFFFFF) | (v >> (32 - c))


def pure_hchacha20(key: bytes, nonce: bytes) -> bytes:
    """HChaCha20 straight from draft-irtf-cfrg-xchacha §2.2 (20 rounds, no feed-forward)."""
    s = list(struct.unpack("<4I", b"expand 32-byte k")) + list(struct.unpack("<8I", key)) + list(struct.unpack("<4I", nonce))

    def qr(a, b, c, d):
        s[a] = (s[a] + s[b]) & 0xFFFFFFFF; s[d] = _rotl(s[d] ^ s[a], 16)
        s[c] = (s[c] + s[d]) & 0xFFFFFFFF; s[b] = _rotl(s[b] ^ s[c], 12)
        s[a] = (s[a] + s[b]) & 0xFFFFFFFF; s[d] = _rotl(s[d] ^ s[a], 8)
        s[c] = (s[c] + s[d]) & 0xFFFFFFFF; s[b] = _rotl(s[b] ^ s[c], 7)

    for _ in range(10):
        qr(0, 4, 8, 12); qr(1, 5, 9, 13); qr(2, 6, 10, 14); qr(3, 7, 11, 15)
        qr(0, 5, 10, 15); qr(1, 6, 11, 12); qr(2, 7, 8, 13); qr(3, 4, 9, 14)
    return struct.pack("<8I", *(s[0:4] + s[12:16]))


def test_hchacha20_draft_vector():
    # draft-irtf-cfrg-xchacha-03 §2.2.1
    key = bytes(range(32))
    nonce = bytes.fromhex("000000090000004a0000000031415927")
    expected = "82413b4227b27bfed30e42508a877d73a0f9e4d58a74a853c12ec41326d3ecdc"
    assert crypto.hchacha20(key, nonce).hex() == expected
    assert pure_hchacha20(key, nonce).hex() == expected


@settings(max_examples=50, deadline=None)
@given(st.binary(min_size=32, max_size=32), st.binary(min_size=16, max_size=16))
def test_hchacha20_matches_pure_python(key, nonce):
    assert crypto.hchacha20(key, nonce) == pure_hchacha20(key, nonce)


def test_xchacha20poly1305_draft_vector():
    # draft-irtf-cfrg-xchacha-03 Appendix A.3.1
    pt = (b"Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the future, "
          b"sunscreen would be it.")
    aad = bytes.fromhex("50515253c0c1c2c3c4c5c6c7")
    key = bytes(range(0x80, 0xA0))
    nonce = bytes.fromhex("404142434445464748494a4b4c4d4e4f5051525354555657")
    out = crypto.xaead_encrypt(key, nonce, pt, aad)
    assert out[:16].hex() == "bd6d179d3e83d43b9576579493c0e939"
    assert out[-16:].hex() == "c0875924c1c7987947deafd8780acf49"
    assert crypto.xaead_decrypt(key, nonce, out, aad) == pt
    with pytest.raises(RemoteProtocolError):
        crypto.xaead_decrypt(key, nonce, out, aad + b"x")


def test_hash_mac_hmac_kdf_follow_their_definitions():
    key, data = os.urandom(32), os.urandom(77)
    assert crypto.hash(data) == hashlib.blake2s(data).digest()
    assert crypto.mac(key, data) == hashlib.blake2s(data, key=key, digest_size=16).digest()
    assert crypto.hmac(key, data) == hmac.new(key, data, "blake2s").digest()
    t0 = hmac.new(key, data, "blake2s").digest()
    t1 = hmac.new(t0, b"\x01", "blake2s").digest()
    t2 = hmac.new(t0, t1 + b"\x02", "blake2s").digest()
    t3 = hmac.new(t0, t2 + b"\x03", "blake2s").digest()
    assert crypto.kdf1(key, data) == t1
    assert crypto.kdf2(key, data) == (t1, t2)
    assert crypto.kdf3(key, data) == (t1, t2, t3)


def test_aead_rejects_tampering_with_our_error():
    key = os.urandom(32)
    sealed = crypto.aead_encrypt(key, 7, b"payload", b"ad")
    assert crypto.aead_decrypt(key, 7, sealed, b"ad") == b"payload"
    for bad in (lambda: crypto.aead_decrypt(key, 8, sealed, b"ad"),
                lambda: crypto.aead_decrypt(key, 7, sealed[:-1] + bytes([sealed[-1] ^ 1]), b"ad"),
                lambda: crypto.aead_decrypt(os.urandom(32), 7, sealed, b"ad")):
        with pytest.raises(RemoteProtocolError):
            bad()


def test_tai64n_is_big_endian_tai_and_increases():
    ts = crypto.tai64n(1_700_000_000.5)
    secs, nanos = struct.unpack(">QI", ts)
    assert secs == 0x400000000000000A + 1_700_000_000
    assert 0 <= 500_000_000 - nanos < 1 << 24  # whitened to 2^24 ns
    assert crypto.tai64n(1_700_000_001.0) > ts > crypto.tai64n(1_699_999_999.9)


def test_low_order_public_key_is_a_remote_error():
    private = crypto.private_from_bytes(os.urandom(32))
    with pytest.raises(RemoteProtocolError):
        crypto.dh(private, bytes(32))


def test_the_sessions_packed_nonce_is_the_whitepapers_counter_nonce():
    from anex_agent.wg.crypto import counter_nonce
    from anex_agent.wg.session import _NONCE

    for counter in (0, 1, 255, 256, 2**32 + 7, 2**60 + 12345, 2**64 - 1):
        assert _NONCE.pack(counter) == counter_nonce(counter)
