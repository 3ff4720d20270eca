"""mac1, mac2 and cookie replies: WireGuard's DoS mitigation (whitepaper §5.3, §5.4.4, §5.4.7).

Two halves:

* :class:`CookieChecker` belongs to the *receiving* device. It checks mac1 (keyed by
  our own public key: proves the sender knows who we are), checks mac2 against a cookie
  bound to the sender's address, and -- when we are under load and mac2 is missing or
  stale -- builds a type-3 cookie reply instead of doing any Diffie-Hellman.
* :class:`CookieGenerator` belongs to each *peer* we send handshake messages to. It
  appends mac1 and, while a cookie received from that peer is fresh (< 120 s), mac2;
  it decrypts cookie replies using the mac1 of the last message we sent as AAD.

``src`` is the sender address as bytes (see :func:`endpoint_bytes`).
"""

from __future__ import annotations

import hmac as _hmac
import ipaddress
import struct
from collections.abc import Callable, Hashable

from anex_agent.errors import RemoteProtocolError
from anex_agent.wg import crypto
from anex_agent.wg.constants import COOKIE_LIFETIME, COOKIE_SECRET_LIFETIME, LABEL_COOKIE, LABEL_MAC1, MAC_SIZE
from anex_agent.wg.messages import CookieReply


def endpoint_bytes(endpoint: Hashable) -> bytes:
    """Bytes identifying a sender address for the cookie (§5.4.7: IP address and port).

    ``(host, port)`` tuples with an IP literal give packed address + 2-byte port; any
    other endpoint object (a WebSocket bind's connection id, ...) uses its ``repr``.
    """
    if isinstance(endpoint, tuple) and len(endpoint) >= 2 and isinstance(endpoint[1], int):
        try:
            return ipaddress.ip_address(endpoint[0]).packed + struct.pack("<H", endpoint[1] & 0xFFFF)
        except ValueError:
            pass
    return repr(endpoint).encode()


class CookieChecker:
    """Validates macs on incoming handshake messages; creates cookie replies (responder side)."""

    def __init__(self, local_public: bytes, random_bytes: Callable[[int], bytes]) -> None:
        self._mac1_key = crypto.hash(LABEL_MAC1 + local_public)
        self._cookie_key = crypto.hash(LABEL_COOKIE + local_public)
        self._random_bytes = random_bytes
        self._secret = b""
        self._secret_born = float("-inf")

    def check_mac1(self, message: bytes) -> bool:
        """True when the message's mac1 (the 16 bytes before the last 16) is valid for us."""
        expected = crypto.mac(self._mac1_key, message[: -2 * MAC_SIZE])
        return _hmac.compare_digest(expected, message[-2 * MAC_SIZE : -MAC_SIZE])

    def check_mac2(self, message: bytes, src: bytes, now: float) -> bool:
        """True when mac2 was made with the current cookie for ``src`` (secret younger than 120 s)."""
        if now - self._secret_born > COOKIE_SECRET_LIFETIME:
            return False
        cookie = crypto.mac(self._secret, src)
        return _hmac.compare_digest(crypto.mac(cookie, message[:-MAC_SIZE]), message[-MAC_SIZE:])

    def create_reply(self, message: bytes, receiver: int, src: bytes, now: float) -> CookieReply:
        """Build the cookie reply to ``message`` (whose sender index is ``receiver``) from ``src``."""
        if now - self._secret_born > COOKIE_SECRET_LIFETIME:
            self._secret = self._random_bytes(32)
            self._secret_born = now
        cookie = crypto.mac(self._secret, src)
        nonce = self._random_bytes(24)
        mac1 = message[-2 * MAC_SIZE : -MAC_SIZE]
        return CookieReply(receiver, nonce, crypto.xaead_encrypt(self._cookie_key, nonce, cookie, mac1))


class CookieGenerator:
    """Adds mac1/mac2 to handshake messages we send to one peer; keeps that peer's cookie."""

    def __init__(self, peer_public: bytes) -> None:
        self._mac1_key = crypto.hash(LABEL_MAC1 + peer_public)
        self._cookie_key = crypto.hash(LABEL_COOKIE + peer_public)
        self._cookie: bytes | None = None
        self._cookie_received = float("-inf")
        self._last_mac1: bytes | None = None

    def add_macs(self, message: bytes, now: float) -> bytes:
        """Return ``message`` (whose last 32 bytes are placeholder macs) with mac1 and mac2 filled in."""
        body = message[: -2 * MAC_SIZE]
        mac1 = crypto.mac(self._mac1_key, body)
        self._last_mac1 = mac1
        if self._cookie is not None and now - self._cookie_received < COOKIE_LIFETIME:
            mac2 = crypto.mac(self._cookie, body + mac1)
        else:
            mac2 = bytes(MAC_SIZE)
        return body + mac1 + mac2

    def consume_reply(self, reply: CookieReply, now: float) -> None:
        """Decrypt and store the cookie of a reply to our last message; RemoteProtocolError if it fails."""
        if self._last_mac1 is None:
            raise RemoteProtocolError("cookie reply but we sent no handshake message")
        self._cookie = crypto.xaead_decrypt(self._cookie_key, reply.nonce, reply.encrypted_cookie, self._last_mac1)
        self._cookie_received = now
        self._last_mac1 = None  # one reply per message (wireguard-go: hasLastMAC1)

    def clear(self) -> None:
        self._cookie = None
        self._last_mac1 = None
