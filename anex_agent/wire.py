"""Wire models shared by the coordinator and its clients (agent, gateway, cluster).

One set of pydantic models for both sides, like tailscale's ``tailcfg``: the
coordinator validates requests with them and serialises responses with them; the
client in :mod:`anex_agent.client` parses responses with the same classes. A change
here is a change of the REST contract and of ``/v1/openapi.json``.

Conventions:
* keys are WireGuard base64 public keys (44 characters); private keys never appear here;
* times are RFC 3339 UTC datetimes; durations are seconds;
* addresses are plain IPv4/IPv6 strings, networks are CIDR strings;
* every config-carrying document has a ``version``: a monotonically increasing integer
  of the coordinator's change log, used by the watch stream to resync.

Routes (see the coordinator's OpenAPI document for the authoritative list):
    POST   /v1/join-tokens                admin      JoinTokenCreate -> JoinTokenCreated
    GET    /v1/join-tokens                admin      -> JoinTokenList
    DELETE /v1/join-tokens/{id}           admin      -> 204 (revoke)
    POST   /v1/nodes                      join token NodeJoinRequest -> NodeJoinResponse
    GET    /v1/nodes                      admin      -> NodeList
    GET    /v1/nodes/{id}                 admin      -> NodeView
    DELETE /v1/nodes/{id}                 admin      -> 204
    POST   /v1/nodes/{id}/heartbeat       node       Heartbeat -> HeartbeatAck
    GET    /v1/nodes/{id}/config          node/admin -> NodeConfig
    PUT    /v1/nodes/{id}/tunnels         admin      TunnelsUpdate -> NodeConfig
    GET    /v1/nodes/{id}/telemetry       node/admin -> NodeTelemetry
    POST   /v1/nodes/{id}/access-token    admin      -> AgentAccessToken (cluster -> agent API)
    POST   /v1/gateways                   gw token   GatewayRegisterRequest -> GatewayRegisterResponse
    GET    /v1/gateways                   admin      -> GatewayList
    DELETE /v1/gateways/{id}              admin      -> 204
    GET    /v1/gateways/{id}/peers        gateway    -> PeerSet
    GET    /v1/watch                      node/gw    WebSocket of WatchEvent
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
from datetime import datetime
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from anex_agent import telemetry_bounds


def _check_public_key(value: str) -> str:
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("must be a WireGuard public key: 44 characters of base64 (32 bytes)") from None
    if len(raw) != 32:
        raise ValueError(f"decodes to {len(raw)} bytes; a WireGuard public key is 32 bytes (44 base64 characters)")
    return value


def _check_cidr(value: str) -> str:
    try:
        return str(ipaddress.ip_network(value, strict=False))
    except ValueError:
        raise ValueError("must be a network in CIDR form, for example 10.96.0.0/12") from None


def _check_host_port(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError("must be HOST:PORT with a port from 1 to 65535 (IPv6 hosts in brackets)")
    return value


PublicKey = Annotated[str, AfterValidator(_check_public_key)]
Cidr = Annotated[str, AfterValidator(_check_cidr)]
HostPort = Annotated[str, AfterValidator(_check_host_port)]
Port = Annotated[int, Field(ge=1, le=65535)]


class Model(BaseModel):
    """Base: unknown fields are rejected (a typo is an error, not silently ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Provider(str, Enum):
    vastai = "vastai"
    runpod = "runpod"
    onprem = "onprem"
    other = "other"


class TokenKind(str, Enum):
    node = "node"
    gateway = "gateway"


class NodeState(str, Enum):
    """pending (joined, no heartbeat yet) -> ready -> not_ready (missed heartbeats) -> expired."""

    pending = "pending"
    ready = "ready"
    not_ready = "not_ready"
    expired = "expired"


class Health(str, Enum):
    healthy = "healthy"
    degraded = "degraded"
    unhealthy = "unhealthy"
    unknown = "unknown"


# ---------------------------------------------------------------- join tokens


class JoinTokenCreate(Model):
    kind: TokenKind = TokenKind.node
    reusable: bool = False
    expires_in: int = Field(3600, ge=1, le=365 * 86400, description="seconds until the token expires")
    labels: dict[str, str] = Field(default_factory=dict)


class JoinTokenCreated(Model):
    id: str
    token: str = Field(description="the secret; shown once, stored only hashed")
    kind: TokenKind
    reusable: bool
    expires_at: datetime
    labels: dict[str, str]


class JoinTokenView(Model):
    """A join token as the admin sees it later: never the secret."""

    id: str
    kind: TokenKind
    reusable: bool
    labels: dict[str, str]
    created_at: datetime
    expires_at: datetime
    used_at: datetime | None = None
    used_by: str | None = Field(None, description="node or gateway id that used a single-use token")
    use_count: int = 0


class JoinTokenList(Model):
    tokens: list[JoinTokenView]


# ---------------------------------------------------------------- node join


class NodeFacts(Model):
    hostname: str = ""
    capabilities: list[str] = Field(default_factory=list, description="e.g. kernel-wireguard, wireguard-go, udp")
    detect: dict[str, Any] = Field(default_factory=dict, description="the agent's detect report")
    agent_version: str = ""


class NodeJoinRequest(Model):
    token: str
    public_key: PublicKey
    name: str = Field(min_length=1, max_length=253)
    provider: Provider
    facts: NodeFacts = Field(default_factory=NodeFacts)


class GatewayPeer(Model):
    """How a node reaches one gateway."""

    id: str
    public_key: PublicKey
    endpoint: str | None = Field(None, description="UDP HOST:PORT of the gateway's WireGuard hub")
    ws_url: str | None = Field(None, description="WebSocket relay URL (ws:// or wss://) for UDP-blocked nodes")
    allowed_ips: list[Cidr]
    persistent_keepalive: int = Field(25, ge=0, le=65535)
    mesh_address: str


class TunnelSpec(Model):
    """A TCP forward on the node: 127.0.0.1:<listen_port> -> <target> over the mesh (GW_TUNNEL_<port>)."""

    listen_port: Port
    target: HostPort


class NodeConfig(Model):
    """Everything a node needs to run its data plane. ``version`` orders changes."""

    node_id: str
    version: int
    address: str
    network: Cidr
    mtu: int = Field(ge=1280, le=9000)
    dns: list[str]
    search_domains: list[str] = Field(default_factory=list)
    gateways: list[GatewayPeer]
    tunnels: list[TunnelSpec] = Field(default_factory=list)
    agent_api_verify_key: str = Field(
        "", description="Ed25519 public key (base64) that signs cluster access tokens for the agent API"
    )


class NodeJoinResponse(Model):
    node_id: str
    credential: str = Field(description="bearer credential of this node; shown once, stored only hashed")
    config: NodeConfig


# ---------------------------------------------------------------- heartbeats


class TransportStatus(Model):
    engine: str = ""
    path: str = ""
    last_handshake_age: float | None = Field(None, description="seconds since the last handshake, None if never")
    rx_bytes: int = 0
    tx_bytes: int = 0


class Heartbeat(Model):
    status: TransportStatus = Field(default_factory=TransportStatus)
    config_version: int = 0
    telemetry: Annotated[dict[str, Any] | None, AfterValidator(telemetry_bounds.check)] = Field(
        None,
        description=(
            "opaque to the coordinator except telemetry['health'] = {'verdict': healthy|degraded|unhealthy, "
            "'reasons': [...]}; see anex_agent.gpu for the shape; bounded by anex_agent.telemetry_bounds"
        ),
    )


class HeartbeatAck(Model):
    state: NodeState
    config_version: int = Field(description="the coordinator's current config version for this node")
    next_heartbeat_in: float = Field(description="seconds until the coordinator expects the next heartbeat")


# ---------------------------------------------------------------- admin views


class NodeView(Model):
    id: str
    name: str
    provider: Provider
    public_key: PublicKey
    address: str
    state: NodeState
    health: Health = Health.unknown
    health_reasons: list[str] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    facts: NodeFacts = Field(default_factory=NodeFacts)
    status: TransportStatus | None = None
    created_at: datetime
    last_heartbeat_at: datetime | None = None
    tunnels: list[TunnelSpec] = Field(default_factory=list)


class NodeList(Model):
    nodes: list[NodeView]


class NodeTelemetry(Model):
    """``GET /v1/nodes/{id}/telemetry``: the latest telemetry payload the node sent, as it sent it."""

    node_id: str
    received_at: datetime | None = None
    telemetry: dict[str, Any] | None = None


class TunnelsUpdate(Model):
    tunnels: list[TunnelSpec]


class AgentAccessToken(Model):
    token: str = Field(description="signed, short-lived bearer token the cluster presents to the node's agent API")
    expires_at: datetime


# ---------------------------------------------------------------- gateways


class GatewayRegisterRequest(Model):
    token: str
    public_key: PublicKey
    name: str = Field(min_length=1, max_length=253)
    endpoint: HostPort | None = Field(None, description="UDP HOST:PORT nodes use to reach the hub")
    ws_url: str | None = Field(None, description="WebSocket relay URL")
    routes: list[Cidr] = Field(default_factory=list, description="cluster networks reachable through this gateway")


class MeshPeer(Model):
    """A peer a gateway must serve: one node."""

    node_id: str
    name: str
    public_key: PublicKey
    allowed_ips: list[Cidr]


class PeerSet(Model):
    version: int
    peers: list[MeshPeer]


class GatewayRegisterResponse(Model):
    gateway_id: str
    credential: str = Field(description="bearer credential of this gateway; shown once, stored only hashed")
    address: str = Field(description="the gateway's mesh address (also the nodes' DNS server)")
    network: Cidr
    mtu: int
    peers: PeerSet


class GatewayView(Model):
    id: str
    name: str
    public_key: PublicKey
    address: str
    endpoint: str | None
    ws_url: str | None
    routes: list[Cidr]
    created_at: datetime
    last_seen_at: datetime | None = None


class GatewayList(Model):
    gateways: list[GatewayView]


# ---------------------------------------------------------------- watch stream


class WatchEvent(Model):
    """One message on ``GET /v1/watch`` (JSON text frames).

    The client connects with ``?since=<version>`` (0 for none). The server first
    sends a ``snapshot`` when ``since`` is older than what it can replay, else the
    missed events in order; then live events. Types:

    * ``snapshot`` -- gateways: ``peers`` is the full set; nodes: ``config`` is the full config;
    * ``peer_added`` / ``peer_removed`` -- gateways only, one ``peer``;
    * ``config`` -- nodes only, the node's new full config;
    * ``gateway_changed`` -- nodes only: gateways changed, ``config`` holds the new full config.
    """

    type: Literal["snapshot", "peer_added", "peer_removed", "config", "gateway_changed"]
    version: int
    peers: list[MeshPeer] | None = None
    peer: MeshPeer | None = None
    config: NodeConfig | None = None


# ---------------------------------------------------------------- errors


class Problem(BaseModel):
    """RFC 9457 problem details (``application/problem+json``).

    ``errors`` lists field-level problems: ``{"field": "public_key", "message": "..."}``.
    """

    model_config = ConfigDict(extra="allow")

    type: str = "about:blank"
    title: str
    status: int
    detail: str = ""
    instance: str | None = None
    errors: list[dict[str, str]] = Field(default_factory=list)
