"""The watch stream: the events a node or gateway receives on ``GET /v1/watch`` (a WebSocket).

    GET    /v1/watch                      node/gw    WebSocket of WatchEvent

An event carries whole documents: a node's config (:class:`~anex_agent.wire.nodes.NodeConfig`),
a gateway's peers (:class:`~anex_agent.wire.gateways.MeshPeer`), ordered by ``version``; see
:class:`WatchEvent`. Clients read them with :func:`anex_agent.wire.reader.read`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from anex_agent.wire.base import Model
from anex_agent.wire.gateways import MeshPeer
from anex_agent.wire.nodes import NodeConfig


class SshRevocation(Model):
    """An SSH user certificate the node must refuse from now on (until it expires anyway)."""

    serial: int = Field(ge=1)
    valid_before: float = Field(description="when the certificate expires (seconds since the epoch)")


class WatchEvent(Model):
    """One message on ``GET /v1/watch`` (JSON text frames).

    The client connects with ``?since=<version>`` (0 for none). The server first
    sends a ``snapshot`` when ``since`` is older than what it can replay, else the
    missed events in order; then live events. Types:

    * ``snapshot`` -- gateways: ``peers`` is the full set; nodes: ``config`` is the full config;
    * ``peer_added`` / ``peer_removed`` -- gateways only, one ``peer``;
    * ``config`` -- nodes only, the node's new full config;
    * ``gateway_changed`` -- nodes only: gateways changed, ``config`` holds the new full config;
    * ``ssh_revoked`` -- nodes only: an SSH user certificate for this node was revoked
      (``ssh_revoked``); a resumed stream replays those after ``since`` (docs/remote-access.md).
    """

    type: Literal["snapshot", "peer_added", "peer_removed", "config", "gateway_changed", "ssh_revoked"]
    version: int
    peers: list[MeshPeer] | None = None
    peer: MeshPeer | None = None
    config: NodeConfig | None = None
    ssh_revoked: SshRevocation | None = None
