"""Proof of key possession for node join and gateway registration (pure: no I/O, no clock).

Knowing a WireGuard public key proves nothing; holding its private key does. A join or
registration request names a public key and carries a ``proof`` that only the holder of
the matching private key can compute (see ``docs/coordinator.md``, "Proof of key
possession")::

    shared  = X25519(caller_private, coordinator_public)       # == X25519(coordinator_private, caller_public)
    key     = HKDF-SHA256(shared, salt = 32 zero bytes, info = PURPOSE, length = 32)
    digest  = SHA-256(canonical JSON of the request without "proof")   # token included
    message = PURPOSE "\\n" public_key "\\n" timestamp "\\n" nonce "\\n" hex(digest)
    mac     = base64(HMAC-SHA256(key, message))

``PURPOSE`` is :data:`NODE_JOIN` or :data:`GATEWAY_REGISTRATION`, so a proof for one can
never be used for the other. Canonical JSON: keys sorted, no whitespace
(``separators=(",", ":")``), ASCII only, of the fields present in the request body (those
left out, and so defaulted by the coordinator, are not covered: a coordinator that knows
more optional fields than its client still checks the client's proofs), values as the
coordinator parses them (pydantic's JSON mode: send them in canonical form).

Contract: :func:`make` is the client's side, :func:`verify` the coordinator's; both take
``now`` (seconds since the epoch). :func:`verify` checks the MAC in constant time and the
timestamp within :data:`WINDOW` seconds either way; refusing a replayed nonce is the
caller's job (it needs shared storage).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from anex_agent.errors import RemoteProtocolError

NODE_JOIN = "anex node join v1"
GATEWAY_REGISTRATION = "anex gateway registration v1"
#: A node opening a WebSocket relay connection to a gateway (the gateway's key instead of the
#: coordinator's; see :mod:`anex_agent.net.relay_protocol`).
RELAY_CONNECT = "anex relay connect v1"
PURPOSES = (NODE_JOIN, GATEWAY_REGISTRATION, RELAY_CONNECT)

#: Seconds a proof's timestamp may lie before or after the coordinator's clock.
WINDOW = 120
NONCE_BYTES = 16


class ProofError(RemoteProtocolError, ValueError):
    """The proof does not hold (wrong key, wrong MAC, stale timestamp)."""


def _shared(private: bytes, public: bytes) -> bytes:
    try:
        return X25519PrivateKey.from_private_bytes(private).exchange(X25519PublicKey.from_public_bytes(public))
    except ValueError:  # a low-order public key gives the all-zero secret
        raise ProofError("no shared secret with this public key") from None


def mac_key(private: bytes, public: bytes, purpose: str) -> bytes:
    """The HMAC key one side derives from its private key and the other side's public key."""
    if purpose not in PURPOSES:
        raise ValueError(f"unknown proof purpose {purpose!r}")
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=bytes(32), info=purpose.encode()).derive(
        _shared(private, public)
    )


def body_digest(fields: dict[str, Any]) -> str:
    """Hex SHA-256 of the canonical JSON of the request's fields (everything but ``proof``)."""
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def message(purpose: str, public_key: str, timestamp: int, nonce: str, digest: str) -> bytes:
    return "\n".join([purpose, public_key, str(int(timestamp)), nonce, digest]).encode("utf-8")


def _mac(key: bytes, purpose: str, public_key: str, timestamp: int, nonce: str, digest: str) -> bytes:
    return hmac.new(key, message(purpose, public_key, timestamp, nonce, digest), hashlib.sha256).digest()


def make(
    purpose: str, *, private_key: bytes, public_key: str, coordinator_key: bytes, fields: dict[str, Any], now: float,
    nonce: str | None = None,
) -> dict[str, Any]:
    """The ``proof`` object for a request with ``fields`` (JSON mode, without ``proof``)."""
    nonce = nonce or base64.urlsafe_b64encode(secrets.token_bytes(NONCE_BYTES)).decode().rstrip("=")
    timestamp = int(now)
    key = mac_key(private_key, coordinator_key, purpose)
    mac = _mac(key, purpose, public_key, timestamp, nonce, body_digest(fields))
    return {"timestamp": timestamp, "nonce": nonce, "mac": base64.b64encode(mac).decode("ascii")}


def verify(
    purpose: str, *, coordinator_private: bytes, public_key: str, timestamp: int, nonce: str, mac: str,
    fields: dict[str, Any], now: float,
) -> None:
    """Raise :class:`ProofError` unless ``mac`` proves possession of ``public_key``'s private key."""
    if abs(now - timestamp) > WINDOW:
        raise ProofError("timestamp outside the allowed window")
    try:
        given = base64.b64decode(mac, validate=True)
        caller = base64.b64decode(public_key, validate=True)
    except (binascii.Error, ValueError):
        raise ProofError("not base64") from None
    key = mac_key(coordinator_private, caller, purpose)
    expected = _mac(key, purpose, public_key, timestamp, nonce, body_digest(fields))
    if not hmac.compare_digest(given, expected):
        raise ProofError("wrong MAC")
