"""Known answers: a handshake from FIXED static keys, ephemerals and timestamp, checked step by step
against a second implementation written here from the whitepaper's formulas (§5.4.2 - §5.4.5).

The reference below uses only hashlib, hmac and cryptography; it shares no code with
anex_agent.wg, so a bug in the core cannot hide in both sides at once. It checks the
exact bytes of both messages (macs included), the chaining key and hash after each
message, and the transport keys (by decrypting traffic sealed with the reference keys).
"""

from __future__ import annotations

import hashlib
import hmac
import struct

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

import pytest

from anex_agent.wg.handshake import Handshake, Identity, consume_initiation
from anex_agent.wg.cookie import CookieGenerator
from anex_agent.wg.messages import parse

# Fixed inputs (any 32 bytes are valid X25519 private keys).
S_I = bytes.fromhex("e8a4d9f3c1b2a0918f7e6d5c4b3a29180716f5e4d3c2b1a09f8e7d6c5b4a3948")
S_R = bytes.fromhex("58b1c2d3e4f5061728394a5b6c7d8e9fa0b1c2d3e4f5061728394a5b6c7d8e6f")
E_I = bytes.fromhex("a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebf")
E_R = bytes.fromhex("c0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedf")
TIMESTAMP = bytes.fromhex("400000006553f1000a0b0000")
I_INDEX, R_INDEX = 0x11223344, 0x55667788


# ---- the reference, from the whitepaper ---------------------------------------------------------

def HASH(x): return hashlib.blake2s(x).digest()
def MAC(k, x): return hashlib.blake2s(x, key=k, digest_size=16).digest()
def HMAC(k, x): return hmac.new(k, x, hashlib.blake2s).digest()


def KDF(n, key, x):
    t0 = HMAC(key, x)
    out, prev = [], b""
    for i in range(1, n + 1):
        prev = HMAC(t0, prev + bytes([i]))
        out.append(prev)
    return out


def AEAD(k, counter, plain, auth):
    return ChaCha20Poly1305(k).encrypt(b"\0" * 4 + struct.pack("<Q", counter), plain, auth)


def PUB(priv): return X25519PrivateKey.from_private_bytes(priv).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
def DH(priv, pub): return X25519PrivateKey.from_private_bytes(priv).exchange(X25519PublicKey.from_public_bytes(pub))


def reference(psk: bytes):
    """Returns every intermediate value of one handshake between S_I (initiator) and S_R."""
    r = {}
    Si_pub, Sr_pub = PUB(S_I), PUB(S_R)
    C = HASH(b"Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s")
    H = HASH(C + b"WireGuard v1 zx2c4 Jason@zx2c4.com")
    H = HASH(H + Sr_pub)
    Ei_pub = PUB(E_I)
    C = KDF(1, C, Ei_pub)[0]
    H = HASH(H + Ei_pub)
    C, k = KDF(2, C, DH(E_I, Sr_pub))
    static = AEAD(k, 0, Si_pub, H)
    H = HASH(H + static)
    C, k = KDF(2, C, DH(S_I, Sr_pub))
    ts = AEAD(k, 0, TIMESTAMP, H)
    H = HASH(H + ts)
    msg1 = bytes([1, 0, 0, 0]) + struct.pack("<I", I_INDEX) + Ei_pub + static + ts
    mac1 = MAC(HASH(b"mac1----" + Sr_pub), msg1)
    r["msg1"] = msg1 + mac1 + bytes(16)
    r["C1"], r["H1"] = C, H
    Er_pub = PUB(E_R)
    C = KDF(1, C, Er_pub)[0]
    H = HASH(H + Er_pub)
    C = KDF(1, C, DH(E_R, Ei_pub))[0]
    C = KDF(1, C, DH(E_R, Si_pub))[0]
    C, tau, k = KDF(3, C, psk)
    H = HASH(H + tau)
    empty = AEAD(k, 0, b"", H)
    H = HASH(H + empty)
    msg2 = bytes([2, 0, 0, 0]) + struct.pack("<II", R_INDEX, I_INDEX) + Er_pub + empty
    mac1 = MAC(HASH(b"mac1----" + Si_pub), msg2)
    r["msg2"] = msg2 + mac1 + bytes(16)
    r["C2"], r["H2"] = C, H
    r["T_send_i"], r["T_recv_i"] = KDF(2, C, b"")
    return r


# ---- the core under test -----------------------------------------------------------------------

@pytest.mark.parametrize("psk", [bytes(32), bytes(range(32))], ids=["no-psk", "psk"])
def test_handshake_matches_reference_step_by_step(psk):
    ref = reference(psk)
    ini_id, res_id = Identity(S_I), Identity(S_R)
    ini = Handshake(ini_id, res_id.public, psk if any(psk) else None)
    res = Handshake(res_id, ini_id.public, psk if any(psk) else None)

    msg1 = ini.create_initiation(I_INDEX, E_I, TIMESTAMP)
    wire1 = CookieGenerator(res_id.public).add_macs(msg1.to_bytes(), now=0.0)
    assert wire1 == ref["msg1"]
    assert (ini.chaining_key, ini.hash) == (ref["C1"], ref["H1"])

    consumed = consume_initiation(res_id, parse(wire1), {ini_id.public: res}.get, now=0.0)
    assert consumed is res and res.last_timestamp == TIMESTAMP
    assert (res.chaining_key, res.hash) == (ref["C1"], ref["H1"])

    msg2 = res.create_response(R_INDEX, E_R)
    wire2 = CookieGenerator(ini_id.public).add_macs(msg2.to_bytes(), now=0.0)
    assert wire2 == ref["msg2"]
    assert (res.chaining_key, res.hash) == (ref["C2"], ref["H2"])
    ini.consume_response(parse(wire2))
    assert (ini.chaining_key, ini.hash) == (ref["C2"], ref["H2"])

    kp_i, kp_r = ini.derive_keypair(now=0.0), res.derive_keypair(now=0.0)
    assert (kp_i.local_index, kp_i.remote_index) == (I_INDEX, R_INDEX)
    assert (kp_r.local_index, kp_r.remote_index) == (R_INDEX, I_INDEX)
    # Keys: traffic sealed with the reference keys opens with ours, in both directions.
    i_to_r = AEAD(ref["T_send_i"], 0, b"initiator says hi".ljust(32, b"\0"), b"")
    r_to_i = AEAD(ref["T_recv_i"], 0, b"responder says hi".ljust(32, b"\0"), b"")
    assert kp_r.decrypt(0, i_to_r).startswith(b"initiator says hi")
    assert kp_i.decrypt(0, r_to_i).startswith(b"responder says hi")
    # ... and what ours seals opens with the reference keys.
    sealed = parse(kp_i.encrypt(b"x" * 16))
    assert ChaCha20Poly1305(ref["T_send_i"]).decrypt(b"\0" * 4 + struct.pack("<Q", 0), sealed.encrypted_packet, b"") == b"x" * 16


def test_psk_changes_every_transport_key():
    a, b = reference(bytes(32)), reference(bytes(range(32)))
    assert a["C1"] == b["C1"]  # the PSK enters only in message 2 (IKpsk2)
    assert a["T_send_i"] != b["T_send_i"] and a["H2"] != b["H2"]


def test_mismatched_psk_fails_the_response():
    ini_id, res_id = Identity(S_I), Identity(S_R)
    ini = Handshake(ini_id, res_id.public, bytes(range(32)))
    res = Handshake(res_id, ini_id.public, None)
    msg1 = ini.create_initiation(I_INDEX, E_I, TIMESTAMP)
    consume_initiation(res_id, msg1, {ini_id.public: res}.get, now=0.0)
    msg2 = res.create_response(R_INDEX, E_R)
    from anex_agent.errors import RemoteProtocolError
    with pytest.raises(RemoteProtocolError):
        ini.consume_response(msg2)
