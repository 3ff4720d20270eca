"""The links of the agent and the gateway to the coordinator, over :class:`anex_agent.client.rest.CoordinatorClient`.

:class:`LinkBase` is what both links share (the client, its credential, the watch stream);
:class:`anex_agent.gateway.link.GatewayLink` adds the gateway's calls. :class:`CoordinatorLink`
is the node agent's link:

    join(NodeJoinRequest) -> NodeJoinResponse   (proves possession of ``keypair``, set before joining)
    get_config(node_id) -> NodeConfig
    heartbeat(node_id, Heartbeat) -> HeartbeatAck
    watch(since) -> async iterator of WatchEvent (reconnects by itself; raises only
                    a non-retryable error such as a revoked credential)

Every failure is a :class:`~anex_agent.errors.CoordinatorError` whose ``retryable`` says
whether trying again later may help (see the client's contract).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

from anex_agent.wire import keys
from anex_agent.client.rest import CoordinatorClient
from anex_agent.errors import ConfigError
from anex_agent.wire.heartbeat import Heartbeat, HeartbeatAck
from anex_agent.wire.nodes import NodeConfig, NodeJoinRequest, NodeJoinResponse
from anex_agent.wire.watch import WatchEvent


class LinkBase:
    """What the agent's and the gateway's links share: the client, its credential, the watch stream."""

    def __init__(self, base_url: str, *, ca_file: Path | None = None, proxy: str | None = None) -> None:
        self.client = CoordinatorClient(base_url, ca_file=ca_file, proxy=proxy)

    def set_credential(self, credential: str) -> None:
        self.client.set_credential(credential)

    async def close(self) -> None:
        await self.client.close()

    def watch(self, since: int) -> AsyncIterator[WatchEvent]:
        return self.client.watch(since)


class CoordinatorLink(LinkBase):
    keypair: keys.KeyPair | None = None  # the node's WireGuard key pair: joins prove we hold it

    async def join(self, request: NodeJoinRequest) -> NodeJoinResponse:
        if self.keypair is None or self.keypair.public_b64 != request.public_key:
            raise ConfigError("private.key", "the node's key pair is not loaded; cannot prove possession of its key")
        return await self.client.join(request.token, self.keypair, request.name, request.provider, request.facts)

    async def get_config(self, node_id: str) -> NodeConfig:
        return await self.client.get_config(node_id)

    async def heartbeat(self, node_id: str, beat: Heartbeat) -> HeartbeatAck:
        return await self.client.heartbeat(node_id, beat)
