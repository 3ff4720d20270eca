"""Nodes: joining, the config a node runs its data plane from, and the admin's views of nodes.

    POST   /v1/nodes                      join token NodeJoinRequest -> NodeJoinResponse
    GET    /v1/nodes                      admin      -> NodeList
    GET    /v1/nodes/{id}                 admin      -> NodeView
    DELETE /v1/nodes/{id}                 admin      -> 204
    GET    /v1/nodes/{id}/config          node/admin -> NodeConfig
    PUT    /v1/nodes/{id}/tunnels         admin      TunnelsUpdate -> NodeConfig
    GET    /v1/nodes/{id}/telemetry       node/admin -> NodeTelemetry
    POST   /v1/nodes/{id}/access-token    admin      -> AgentAccessToken (cluster -> agent API)

The heartbeat's models are :mod:`anex_agent.wire.heartbeat`; a node follows changes of its
:class:`NodeConfig` on the watch stream (:mod:`anex_agent.wire.watch`).
"""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Any

from pydantic import Field

from anex_agent.wire.base import (
    LIST_MAX, NAME_MAX, URL_MAX, Cidr, DnsServerAddress, HostPort, Model, Name, Port, Provider, PublicKey, Secret,
    ShortText,
)
from anex_agent.wire.heartbeat import NodeState, TransportStatus
from anex_agent.wire.join import KeyProof
from anex_agent.wire.route_policy import DEFAULT_GATEWAY_ROUTES


class NodeFacts(Model):
    hostname: str = Field("", max_length=NAME_MAX)
    capabilities: list[ShortText] = Field(default_factory=list, max_length=LIST_MAX,
                                          description="e.g. kernel-wireguard, wireguard-go, udp")
    detect: dict[str, Any] = Field(default_factory=dict, description="the agent's detect report")
    agent_version: ShortText = ""
    api_port: int = Field(9555, ge=1, le=65535, description="the port of the agent API at the node's mesh address")
    ssh_port: int = Field(0, ge=0, le=65535, description="the port of the node's SSH server at its mesh address; 0: none")


class NodeJoinRequest(Model):
    token: Secret
    public_key: PublicKey
    name: Name
    provider: Provider
    facts: NodeFacts = Field(default_factory=NodeFacts)
    proof: KeyProof | None = Field(None, description="proof of possession of public_key's private key (required)")


class GatewayPeer(Model):
    """How a node reaches one gateway."""

    id: str
    public_key: PublicKey
    endpoint: str | None = Field(None, max_length=URL_MAX, description="UDP HOST:PORT of the gateway's WireGuard hub")
    ws_url: str | None = Field(None, max_length=URL_MAX,
                               description="WebSocket relay URL (ws:// or wss://) for UDP-blocked nodes")
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
    dns: list[DnsServerAddress]
    search_domains: list[str] = Field(default_factory=list)
    gateways: list[GatewayPeer]
    tunnels: list[TunnelSpec] = Field(default_factory=list)
    agent_api_verify_key: str = Field(
        "", description="Ed25519 public key (base64) that signs cluster access tokens for the agent API"
    )
    gateway_routes: list[Cidr] = Field(
        default_factory=lambda: list(DEFAULT_GATEWAY_ROUTES),
        description="networks gateways may offer (the coordinator's --gateway-route); the node installs a gateway's "
        "network only inside one of them, and never one covering the coordinator's address or a gateway's endpoint",
    )


class NodeJoinResponse(Model):
    node_id: str
    credential: str = Field(description="bearer credential of this node; shown once, stored only hashed")
    config: NodeConfig


class Health(str, Enum):
    healthy = "healthy"
    degraded = "degraded"
    unhealthy = "unhealthy"
    unknown = "unknown"


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
    """``GET /v1/nodes/{id}/telemetry``: the latest telemetry payload the node sent, as it sent it.

    The JSON form of :class:`anex_agent.telemetry.models.Telemetry` (validated when it arrived); served
    as an object so that a block stored by an older coordinator is still served as it is."""

    node_id: str
    received_at: datetime | None = None
    telemetry: dict[str, Any] | None = None


class TunnelsUpdate(Model):
    tunnels: list[TunnelSpec] = Field(max_length=LIST_MAX)


class AgentAccessToken(Model):
    token: str = Field(description="signed, short-lived bearer token the cluster presents to the node's agent API; good for one call (the agent refuses a second use)")
    expires_at: datetime
