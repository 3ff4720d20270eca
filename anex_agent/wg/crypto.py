"""Cryptographic primitives of WireGuard (whitepaper §5.4 "Messages", first table).

* ``hash``  -- BLAKE2s-256
* ``mac``   -- keyed BLAKE2s with a 16-byte output
* ``hmac``  -- HMAC-BLAKE2s (32 bytes)
* ``kdf1/2/3`` -- HKDF over HMAC-BLAKE2s, returning 1, 2 or 3 keys
* ``aead_encrypt/decrypt`` -- ChaCha20-Poly1305 (RFC 8439) with a 64-bit little-endian counter nonce
* ``xaead_encrypt/decrypt`` -- XChaCha20-Poly1305: HChaCha20 subkey, then ChaCha20-Poly1305
* ``dh`` -- X25519
* ``tai64n`` -- the 12-byte timestamp of §5.4.2

Failures of authentication raise :class:`RemoteProtocolError`; nothing else escapes.
This module does no I/O and reads no clock.
"""

from __future__ import annotations

import hashlib
import hmac as _hmac
import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from anex_agent.errors import LocalProtocolError, RemoteProtocolError
from anex_agent.wg.constants import KEY_SIZE

EMPTY_KEY = bytes(KEY_SIZE)


def hash(data: bytes) -> bytes:  # noqa: A001 - the whitepaper's name
    """HASH(input) = BLAKE2s(input, 32)."""
    return hashlib.blake2s(data, digest_size=32).digest()


def mac(key: bytes, data: bytes) -> bytes:
    """MAC(key, input) = Keyed-BLAKE2s(key, input, 16)."""
    return hashlib.blake2s(data, digest_size=16, key=key).digest()


def hmac(key: bytes, data: bytes) -> bytes:
    """HMAC(key, input) = HMAC-BLAKE2s(key, input, 32)."""
    return _hmac.new(key, data, hashlib.blake2s).digest()


def kdf1(key: bytes, data: bytes) -> bytes:
    t0 = hmac(key, data)
    return hmac(t0, b"\x01")


def kdf2(key: bytes, data: bytes) -> tuple[bytes, bytes]:
    t0 = hmac(key, data)
    t1 = hmac(t0, b"\x01")
    t2 = hmac(t0, t1 + b"\x02")
    return t1, t2


def kdf3(key: bytes, data: bytes) -> tuple[bytes, bytes, bytes]:
    t0 = hmac(key, data)
    t1 = hmac(t0, b"\x01")
    t2 = hmac(t0, t1 + b"\x02")
    t3 = hmac(t0, t2 + b"\x03")
    return t1, t2, t3


def counter_nonce(counter: int) -> bytes:
    """The 96-bit ChaCha20-Poly1305 nonce: 32 zero bits then the 64-bit little-endian counter."""
    return b"\x00\x00\x00\x00" + struct.pack("<Q", counter)


def aead_encrypt(key: bytes, counter: int, plaintext: bytes, aad: bytes) -> bytes:
    return ChaCha20Poly1305(key).encrypt(counter_nonce(counter), plaintext, aad)


def aead_decrypt(key: bytes, counter: int, ciphertext: bytes, aad: bytes) -> bytes:
    """Decrypt and authenticate; a wrong key, nonce, AAD or a tampered text raises RemoteProtocolError."""
    try:
        return ChaCha20Poly1305(key).decrypt(counter_nonce(counter), ciphertext, aad)
    except InvalidTag:
        raise RemoteProtocolError("AEAD authentication failed") from None


_SIGMA = struct.unpack("<4I", b"expand 32-byte k")


def hchacha20(key: bytes, nonce16: bytes) -> bytes:
    """HChaCha20 (draft-irtf-cfrg-xchacha §2.2): a 32-byte subkey from a key and a 16-byte nonce.

    Computed from one ChaCha20 block: the block function adds the initial state to the
    permuted state, so subtracting the known initial words 0-3 (constants) and 12-15
    (the nonce) recovers the permuted words HChaCha20 outputs.
    """
    if len(key) != 32 or len(nonce16) != 16:
        raise LocalProtocolError("hchacha20 needs a 32-byte key and a 16-byte nonce")
    block = Cipher(algorithms.ChaCha20(key, nonce16), mode=None).encryptor().update(bytes(64))
    out = struct.unpack("<16I", block)
    n = struct.unpack("<4I", nonce16)
    words = [(out[i] - _SIGMA[i]) & 0xFFFFFFFF for i in range(4)]
    words += [(out[12 + i] - n[i]) & 0xFFFFFFFF for i in range(4)]
    return struct.pack("<8I", *words)


def xaead_encrypt(key: bytes, nonce24: bytes, plaintext: bytes, aad: bytes) -> bytes:
    subkey = hchacha20(key, nonce24[:16])
    return ChaCha20Poly1305(subkey).encrypt(b"\x00\x00\x00\x00" + nonce24[16:], plaintext, aad)


def xaead_decrypt(key: bytes, nonce24: bytes, ciphertext: bytes, aad: bytes) -> bytes:
    subkey = hchacha20(key, nonce24[:16])
    try:
        return ChaCha20Poly1305(subkey).decrypt(b"\x00\x00\x00\x00" + nonce24[16:], ciphertext, aad)
    except InvalidTag:
        raise RemoteProtocolError("XAEAD authentication failed") from None


def private_from_bytes(raw: bytes) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(raw)


def public_bytes(private: X25519PrivateKey) -> bytes:
    return private.public_key().public_bytes_raw()


def dh(private: X25519PrivateKey, public: bytes) -> bytes:
    """X25519(private, public). A low-order public key (all-zero result) raises RemoteProtocolError."""
    try:
        return private.exchange(X25519PublicKey.from_public_bytes(public))
    except ValueError:
        raise RemoteProtocolError("X25519 with a low-order public key") from None


# TAI64 label of 1970 plus the 10 s TAI-UTC offset of 1970, as wireguard-go writes it.
_TAI64_BASE = 0x400000000000000A
# wireguard-go blurs the nanoseconds (2^24 ns, about 16.8 ms) so a timestamp says less
# about the sender's clock; we do the same.
_WHITENER_MASK = 0x1000000 - 1


def tai64n(unix_time: float) -> bytes:
    """The 12-byte TAI64N timestamp (§5.4.2) of a UNIX wall-clock time, big endian."""
    seconds = int(unix_time)
    nanos = int((unix_time - seconds) * 1e9) & ~_WHITENER_MASK
    return struct.pack(">QI", _TAI64_BASE + seconds, nanos)
