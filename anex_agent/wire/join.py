"""Joining the mesh: join tokens, and the proof of key possession a node or gateway joins with.

    POST   /v1/join-tokens                admin      JoinTokenCreate -> JoinTokenCreated
    GET    /v1/join-tokens                admin      -> JoinTokenList
    DELETE /v1/join-tokens/{id}           admin      -> 204 (revoke)
    GET    /v1/coordinator                public     -> CoordinatorInfo (key for join proofs)

A join token admits nodes (:class:`anex_agent.wire.nodes.NodeJoinRequest`) or gateways
(:class:`anex_agent.wire.gateways.GatewayRegisterRequest`); both requests carry a
:class:`KeyProof` made with the coordinator's key from :class:`CoordinatorInfo`
(:mod:`anex_agent.wire.proof` makes and checks it).
"""

from __future__ import annotations

from datetime import datetime
from enum import Enum

from pydantic import Field

from anex_agent.wire.base import Labels, Model, Provider, PublicKey


class TokenKind(str, Enum):
    node = "node"
    gateway = "gateway"


class JoinTokenCreate(Model):
    """A new join token. Uses: ``max_uses`` when given; else 1 (single-use), or no limit with
    ``reusable: true``. ``providers`` (node tokens only): the providers a joining node may name."""

    kind: TokenKind = TokenKind.node
    reusable: bool = Field(False, description="true without max_uses: no limit on uses")
    max_uses: int | None = Field(None, ge=1, le=1_000_000, description="nodes/gateways the token may admit; default 1")
    expires_in: int = Field(3600, ge=1, le=365 * 86400, description="seconds until the token expires")
    labels: Labels = Field(default_factory=dict)
    providers: list[Provider] | None = Field(
        None, min_length=1, description="node tokens: a join naming another provider is refused (403); null = any"
    )


class JoinTokenCreated(Model):
    id: str
    token: str = Field(description="the secret; shown once, stored only hashed")
    kind: TokenKind
    reusable: bool
    expires_at: datetime
    labels: dict[str, str]
    max_uses: int | None = Field(None, description="null = no limit")
    providers: list[Provider] | None = None


class JoinTokenView(Model):
    """A join token as the admin sees it later: never the secret."""

    id: str
    kind: TokenKind
    reusable: bool = Field(description="true when the token admits more than one node or gateway")
    labels: dict[str, str]
    created_at: datetime
    expires_at: datetime
    used_at: datetime | None = None
    used_by: str | None = Field(None, description="the first node or gateway that used the token")
    use_count: int = Field(0, description="joins with the token, re-joins included")
    uses: int = Field(0, description="distinct nodes/gateways the token admitted (counted against max_uses)")
    max_uses: int | None = Field(None, description="null = no limit")
    providers: list[Provider] | None = None


class JoinTokenList(Model):
    tokens: list[JoinTokenView]


class KeyProof(Model):
    """Proves the caller holds the private key of the ``public_key`` it names (see :mod:`anex_agent.wire.proof`)."""

    timestamp: int = Field(ge=0, description="seconds since the epoch; within 120 s of the coordinator's clock")
    nonce: str = Field(min_length=16, max_length=64, pattern=r"^[A-Za-z0-9_-]+$", description="random, never reused")
    mac: str = Field(min_length=44, max_length=44, description="base64 HMAC-SHA256 (docs/coordinator.md)")


class CoordinatorInfo(Model):
    """``GET /v1/coordinator`` (no authentication): what a node needs before it joins."""

    public_key: PublicKey = Field(description="the coordinator's X25519 public key, for join proofs")
