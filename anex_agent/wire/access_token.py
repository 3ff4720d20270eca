"""Agent API access tokens: short-lived, single-use, Ed25519-signed, bound to one node.

The cluster asks the coordinator (``POST /v1/nodes/{id}/access-token``, admin) for a
token and presents it to that node's agent API over the mesh as
``Authorization: Bearer <token>``. The agent verifies it offline with the
coordinator's public key, which it received in ``NodeConfig.agent_api_verify_key``.

One token is good for ONE request: the agent remembers the ``jti`` of every token it
accepted until that token expires (:class:`ReplayCache`), so a token read off the wire or
out of a log cannot be used again. A caller fetches a new token for each call. A token
lives at most :data:`MAX_TTL` (one hour), which also bounds how long a ``jti`` is kept.

Format (compact, JWS-like but deliberately not JOSE, so there is no algorithm to
negotiate): ``anexat.<payload>.<signature>`` where ``payload`` is url-safe base64
(no padding) of canonical JSON ``{"v": 1, "sub": NODE_ID, "iat": INT, "exp": INT,
"jti": RANDOM}`` and ``signature`` is url-safe base64 of the Ed25519 signature
over the ASCII bytes ``anexat.<payload>``.

Pure: no clock, no I/O. Callers pass ``now`` (seconds since the epoch).

Verify side (the agent)::

    claims = verify(config.agent_api_verify_key, token, node_id=my_node_id, now=now)
    replay_cache.use(claims, now=now)     # TokenReplayed on a second use
"""

from __future__ import annotations

import base64
import binascii
import heapq
import json
import math
import secrets
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from anex_agent.errors import AnexError, RemoteProtocolError

PREFIX = "anexat"
VERSION = 1
MAX_TTL = 3600  # seconds: a token valid for longer than an hour is refused on both sides
CLOCK_SKEW = 60  # seconds of clock difference tolerated for "iat in the future"
#: token ids an agent remembers at most (each until its token expires); a few MiB at most,
#: room for 4.5 calls a second with one-hour tokens, 54 with the default five minutes
MAX_REMEMBERED = 16384


class InvalidAccessToken(RemoteProtocolError):
    """The token is malformed, not signed by the coordinator, for another node, or expired.

    ``str(err)`` is for logs on the verifying side; do not send it to the caller.
    """


class TokenReplayed(InvalidAccessToken):
    """The token was accepted once already; a token is good for one request."""


class ReplayCacheFull(AnexError):
    """The agent holds :data:`MAX_REMEMBERED` ids of tokens still alive and accepts no new one
    until the oldest expires, ``retry_after`` seconds from now (forgetting a live id instead
    would let that token be replayed)."""

    def __init__(self, retry_after: int) -> None:
        self.retry_after = retry_after
        super().__init__(f"too many live access tokens remembered; retry in {retry_after} s")


@dataclass(frozen=True)
class Claims:
    node_id: str
    issued_at: int
    expires_at: int
    token_id: str


def _b64e(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _b64d(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def generate_signing_key() -> bytes:
    """Return a new Ed25519 private key (32 raw bytes)."""
    return Ed25519PrivateKey.generate().private_bytes_raw()


def verify_key_of(signing_key: bytes) -> str:
    """Return the standard-base64 Ed25519 public key for ``NodeConfig.agent_api_verify_key``."""
    public = Ed25519PrivateKey.from_private_bytes(signing_key).public_key()
    return base64.b64encode(public.public_bytes_raw()).decode()


def sign(signing_key: bytes, node_id: str, *, now: float, ttl: int) -> tuple[str, Claims]:
    """Return ``(token, claims)`` for ``node_id``, valid ``ttl`` seconds from ``now``."""
    if not node_id:
        raise ValueError("node_id must not be empty")
    if not 1 <= ttl <= MAX_TTL:
        raise ValueError(f"ttl must be 1..{MAX_TTL} seconds, got {ttl}")
    claims = Claims(node_id=node_id, issued_at=int(now), expires_at=int(now) + ttl, token_id=secrets.token_hex(8))
    body = {"v": VERSION, "sub": claims.node_id, "iat": claims.issued_at, "exp": claims.expires_at, "jti": claims.token_id}
    payload = _b64e(json.dumps(body, separators=(",", ":"), sort_keys=True).encode())
    signed = f"{PREFIX}.{payload}".encode("ascii")
    signature = Ed25519PrivateKey.from_private_bytes(signing_key).sign(signed)
    return f"{PREFIX}.{payload}.{_b64e(signature)}", claims


def verify(verify_key: str, token: str, *, node_id: str, now: float) -> Claims:
    """Return the claims of a valid token for ``node_id``; raise InvalidAccessToken otherwise."""
    try:
        public = Ed25519PublicKey.from_public_bytes(base64.b64decode(verify_key, validate=True))
    except (binascii.Error, ValueError):
        raise InvalidAccessToken("the verify key is not a base64 Ed25519 public key") from None
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != PREFIX:
        raise InvalidAccessToken(f"not an access token (expected {PREFIX}.<payload>.<signature>)")
    try:
        signature = _b64d(parts[2])
        public.verify(signature, f"{PREFIX}.{parts[1]}".encode("ascii"))
    except (InvalidSignature, binascii.Error, ValueError, UnicodeEncodeError):
        raise InvalidAccessToken("bad signature") from None
    try:
        body = json.loads(_b64d(parts[1]))
        claims = Claims(
            node_id=str(body["sub"]), issued_at=int(body["iat"]), expires_at=int(body["exp"]), token_id=str(body["jti"])
        )
        version = body["v"]
    except (ValueError, KeyError, TypeError):
        raise InvalidAccessToken("malformed payload") from None
    if version != VERSION:
        raise InvalidAccessToken(f"unsupported token version {version!r}")
    if claims.node_id != node_id:
        raise InvalidAccessToken("token is for another node")
    if not 0 < claims.expires_at - claims.issued_at <= MAX_TTL:
        raise InvalidAccessToken(f"token lifetime is not 1..{MAX_TTL} seconds")
    if now >= claims.expires_at:
        raise InvalidAccessToken("token expired")
    if claims.issued_at > now + CLOCK_SKEW:
        raise InvalidAccessToken("token issued in the future")
    return claims


class ReplayCache:
    """The ids of the tokens already accepted, each kept until its token expires.

    :meth:`use` is called once per request with the claims :func:`verify` returned, with
    the same ``now``; after it returns, a second :meth:`use` of the same token raises
    :class:`TokenReplayed` for as long as :func:`verify` would still accept the token
    (``now < expires_at``). Ids of expired tokens are dropped as time passes, so at most
    ``capacity`` ids are held; when that many tokens are alive a new one is refused with
    :class:`ReplayCacheFull` rather than forgetting a live id. Not thread-safe (one event loop).
    """

    def __init__(self, capacity: int = MAX_REMEMBERED) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._expiry: dict[str, int] = {}  # jti -> expires_at
        self._heap: list[tuple[int, str]] = []  # (expires_at, jti): the next to forget first

    def __len__(self) -> int:
        return len(self._expiry)

    def __contains__(self, token_id: str) -> bool:
        return token_id in self._expiry

    def prune(self, now: float) -> None:
        """Forget the ids of tokens expired at ``now``."""
        while self._heap and self._heap[0][0] <= now:
            _, token_id = heapq.heappop(self._heap)
            del self._expiry[token_id]

    def use(self, claims: Claims, *, now: float) -> None:
        """Record one use of a verified token; raise TokenReplayed or ReplayCacheFull."""
        self.prune(now)
        if claims.token_id in self._expiry:
            raise TokenReplayed("token already used")
        if claims.expires_at <= now:
            return  # expired: verify() refuses it, nothing to remember
        if len(self._expiry) >= self.capacity:
            raise ReplayCacheFull(max(1, math.ceil(self._heap[0][0] - now)))
        self._expiry[claims.token_id] = claims.expires_at
        heapq.heappush(self._heap, (claims.expires_at, claims.token_id))
