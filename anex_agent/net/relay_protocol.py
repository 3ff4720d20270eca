"""The WebSocket relay protocol between a node and a gateway (pure: no I/O, no clock).

Shared by the agent's WebSocket bind and the gateway's relay. One WebSocket connection
carries WireGuard datagrams between one node and the gateway's hub::

    client                                   gateway relay
    GET <ws_url>  Sec-WebSocket-Protocol: anex-wg.v2, anex-wg.v1
                                      <-     101, subprotocol anex-wg.v2 (or v1)
                                      <-     text  {"v": 1, "challenge": NONCE}
    text {"public_key": PUB, "mac": MAC}  ->
                                      <-     text  {"ok": true}          (or close 4003)
    binary = WireGuard datagram(s)    <->    binary = WireGuard datagram(s)

Authentication is a proof of key possession (the same construction as
:mod:`anex_agent.wire.proof`, purpose :data:`anex_agent.wire.proof.RELAY_CONNECT`), made with the
node's WireGuard private key against the gateway's public key, over the gateway's fresh
random challenge::

    key = HKDF-SHA256(X25519(node_private, gateway_public), info = RELAY_CONNECT)
    mac = base64(HMAC-SHA256(key, RELAY_CONNECT "\\n" PUB "\\n" 0 "\\n" NONCE "\\n" sha256hex(gateway_public)))

The gateway accepts it only when ``PUB`` is a peer the coordinator gave it (its watch
stream: a node that joined with a valid token and was not removed or expired). Nothing is
relayed before ``{"ok": true}``; a binary message before it closes the connection. The
node's bearer credential never leaves the node (a TLS-terminating ingress in front of the
relay never sees a secret worth more than this one connection), the challenge makes a
recorded answer useless, and a node the coordinator removes loses the relay as soon as the
gateway's peer set drops it.

Framing, chosen by the subprotocol:

* ``anex-wg.v1`` (:data:`SUBPROTOCOL`, the baseline every relay and client speaks): one
  datagram per binary message.
* ``anex-wg.v2`` (:data:`SUBPROTOCOL_BATCH`, preferred when both sides offer it): each binary
  message carries one or more datagrams, each prefixed by its length (2 bytes, big endian),
  at most :data:`MAX_BATCH` bytes per message (:func:`pack`, :func:`unpack`). The sender puts
  in one message what it read from its UDP socket in one go; per datagram this saves the
  WebSocket framing and parsing, which is most of the relay's cost.

WireGuard datagrams are at most :data:`MAX_DATAGRAM` bytes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from typing import Any

from anex_agent.errors import RemoteProtocolError
from anex_agent.wire import proof

SUBPROTOCOL = "anex-wg.v1"
SUBPROTOCOL_BATCH = "anex-wg.v2"
#: What a client offers and a relay accepts, preferred first.
SUBPROTOCOLS = (SUBPROTOCOL_BATCH, SUBPROTOCOL)
#: Payload bytes per batched message (a single larger datagram still travels, alone).
MAX_BATCH = 65536
#: The largest binary message either side accepts.
MAX_MESSAGE = MAX_BATCH + 2 + 65535
VERSION = 1
#: The largest datagram relayed (an IPv6 UDP payload can be no larger; WireGuard's are MTU + 32).
MAX_DATAGRAM = 65535
#: Close codes (RFC 6455 §7.4.2: 4000-4999 are for applications).
CLOSE_UNAUTHENTICATED = 4003
CLOSE_PROTOCOL = 1002
CHALLENGE_BYTES = 24
MAX_CONTROL = 1024  # bytes: a control (text) message is never longer


class RelayProtocolError(RemoteProtocolError, ValueError):
    """A control message is malformed or the proof does not hold. Never sent to the peer."""


@dataclass(frozen=True)
class Answer:
    public_key: str
    mac: str


def new_challenge() -> str:
    return base64.urlsafe_b64encode(secrets.token_bytes(CHALLENGE_BYTES)).decode().rstrip("=")


def challenge_message(challenge: str) -> str:
    return json.dumps({"v": VERSION, "challenge": challenge}, separators=(",", ":"))


def parse_challenge(text: str | bytes) -> str:
    doc = _control(text)
    challenge = doc.get("challenge")
    if doc.get("v") != VERSION or not isinstance(challenge, str) or not 16 <= len(challenge) <= 128:
        raise RelayProtocolError("not a relay challenge of version 1")
    return challenge


def _message(public_key: str, challenge: str, gateway_public: bytes) -> bytes:
    return proof.message(proof.RELAY_CONNECT, public_key, 0, challenge, hashlib.sha256(gateway_public).hexdigest())


def answer_message(*, private_key: bytes, public_key: str, gateway_public: bytes, challenge: str) -> str:
    """The client's answer to ``challenge`` (text message)."""
    key = proof.mac_key(private_key, gateway_public, proof.RELAY_CONNECT)
    mac = hmac.new(key, _message(public_key, challenge, gateway_public), hashlib.sha256).digest()
    return json.dumps({"public_key": public_key, "mac": base64.b64encode(mac).decode()}, separators=(",", ":"))


def parse_answer(text: str | bytes) -> Answer:
    doc = _control(text)
    pub, mac = doc.get("public_key"), doc.get("mac")
    if not isinstance(pub, str) or not isinstance(mac, str) or len(pub) > 64 or len(mac) > 64:
        raise RelayProtocolError("not a relay answer")
    return Answer(pub, mac)


def verify_answer(answer: Answer, *, gateway_private: bytes, gateway_public: bytes, challenge: str) -> None:
    """Raise RelayProtocolError unless ``answer`` proves possession of its public key's private key."""
    try:
        caller = base64.b64decode(answer.public_key, validate=True)
        given = base64.b64decode(answer.mac, validate=True)
    except (binascii.Error, ValueError):
        raise RelayProtocolError("not base64") from None
    if len(caller) != 32:
        raise RelayProtocolError("not a 32-byte public key")
    try:
        key = proof.mac_key(gateway_private, caller, proof.RELAY_CONNECT)
    except proof.ProofError as err:
        raise RelayProtocolError(str(err)) from None
    expected = hmac.new(key, _message(answer.public_key, challenge, gateway_public), hashlib.sha256).digest()
    if not hmac.compare_digest(given, expected):
        raise RelayProtocolError("wrong MAC")


OK_MESSAGE = '{"ok":true}'


def pack(datagrams: list[bytes]) -> list[bytes]:
    """``anex-wg.v2`` messages carrying ``datagrams`` in order (length-prefixed, at most MAX_BATCH bytes each)."""
    messages: list[bytes] = []
    parts: list[bytes] = []
    size = 0
    for datagram in datagrams:
        n = len(datagram)
        if n > MAX_DATAGRAM:
            continue  # cannot be a UDP datagram; UDP would not carry it either
        if parts and size + 2 + n > MAX_BATCH:
            messages.append(b"".join(parts))
            parts, size = [], 0
        parts.append(n.to_bytes(2, "big"))
        parts.append(datagram)
        size += 2 + n
    if parts:
        messages.append(b"".join(parts))
    return messages


def unpack(message: bytes) -> list[bytes]:
    """The datagrams of one ``anex-wg.v2`` message; RelayProtocolError when a length runs past its end."""
    out = []
    view = memoryview(message)
    i, end = 0, len(message)
    while i < end:
        if i + 2 > end:
            raise RelayProtocolError("a batched message ends inside a length prefix")
        n = (view[i] << 8) | view[i + 1]
        i += 2
        if i + n > end:
            raise RelayProtocolError("a batched message ends inside a datagram")
        out.append(bytes(view[i:i + n]))
        i += n
    return out


def parse_ok(text: str | bytes) -> None:
    if _control(text).get("ok") is not True:
        raise RelayProtocolError("the relay did not accept the connection")


def _control(text: str | bytes) -> dict[str, Any]:
    if isinstance(text, bytes) or len(text) > MAX_CONTROL:
        raise RelayProtocolError("expected a short text control message")
    try:
        doc = json.loads(text)
    except ValueError:
        raise RelayProtocolError("control message is not JSON") from None
    if not isinstance(doc, dict):
        raise RelayProtocolError("control message is not a JSON object")
    return doc
