"""Gateways: registration, the peers a gateway serves, its credential's rotation, the admin's views.

    POST   /v1/gateways                   gw token   GatewayRegisterRequest -> GatewayRegisterResponse
    GET    /v1/gateways                   admin      -> GatewayList
    DELETE /v1/gateways/{id}              admin      -> 204
    GET    /v1/gateways/{id}/peers        gateway    -> PeerSet
    POST   /v1/gateways/{id}/credential   gateway    -> CredentialRenewal (rotation)

A gateway follows changes of its :class:`PeerSet` on the watch stream (:mod:`anex_agent.wire.watch`);
how a node reaches a gateway is :class:`anex_agent.wire.nodes.GatewayPeer`, part of the node's config.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from anex_agent.wire.base import LIST_MAX, Cidr, HostPort, Model, Name, PublicKey, Secret, WsUrl
from anex_agent.wire.join import KeyProof


class GatewayRegisterRequest(Model):
    token: Secret
    public_key: PublicKey
    name: Name
    endpoint: HostPort | None = Field(None, description="UDP HOST:PORT nodes use to reach the hub")
    ws_url: WsUrl | None = Field(None, description="WebSocket relay URL (ws:// or wss://)")
    routes: list[Cidr] = Field(default_factory=list, max_length=LIST_MAX,
                               description="cluster networks reachable through this gateway")
    proof: KeyProof | None = Field(None, description="proof of possession of public_key's private key (required)")


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
    credential_rotation: float = Field(3600.0, description="renew the credential this often (POST .../credential)")


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
    gone_at: datetime | None = Field(None, description="when it stopped or was found silent; nodes leave it "
                                                       "out until it is back (None: present)")
    gone_reason: str | None = None


class GatewayList(Model):
    gateways: list[GatewayView]


class CredentialRenewal(Model):
    """``POST /v1/gateways/{id}/credential``: the gateway's new credential (the old one ends after a grace)."""

    credential: str
    rotate_in: float = Field(description="seconds until the gateway should renew again")
