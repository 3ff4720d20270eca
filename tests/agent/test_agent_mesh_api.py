"""The agent API's mesh-side listener follows the node's address when the coordinator changes it."""

from __future__ import annotations

import socket

from anex_agent.agent.api import AgentApi
from anex_agent.agent.settings import AgentSettings, ListenAddress
from anex_agent.agent.supervisor import Agent
from anex_agent.wire.keys import KeyPair, generate_private_key
from anex_agent.wire.nodes import GatewayPeer, NodeConfig

GW = KeyPair(generate_private_key()).public_b64


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def config(version: int, address: str) -> NodeConfig:
    # loopback addresses stand in for mesh addresses: 127.0.0.0/8 is all local, no interface to create
    return NodeConfig(node_id="n", version=version, address=address, network="127.0.0.0/8", mtu=1380, dns=[],
                      gateways=[GatewayPeer(id="g", public_key=GW, endpoint="192.0.2.1:51820", allowed_ips=["127.0.0.0/8"], mesh_address="127.0.0.9")])


class OsInterfacePlane:
    """The data plane as the supervisor sees it, for an engine that puts the address on an OS interface."""

    host_address = True
    engine_cls = None

    def __init__(self) -> None:
        self.config: NodeConfig | None = None

    async def apply(self, config: NodeConfig) -> bool:
        self.config = config
        return True


def accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


async def test_the_mesh_listener_moves_with_the_address(tmp_path):
    port = free_port()
    agent = Agent(AgentSettings(coordinator_url="http://127.0.0.1:9", join_token="", state_dir=tmp_path,
                                api_listen=ListenAddress("127.0.0.1", port)))
    agent.dataplane = OsInterfacePlane()

    async def status():
        return {}

    async def ready():
        return True, "ok"

    agent.api = AgentApi(status, ready, lambda token: False)
    try:
        await agent.api.start("127.0.0.1", port)
        await agent.apply_config(config(1, "127.0.0.2"))
        assert accepts("127.0.0.2", port)
        await agent.apply_config(config(2, "127.0.0.3"))  # the coordinator moved the node
        assert accepts("127.0.0.3", port)
        assert not accepts("127.0.0.2", port)  # nothing listens on the old address any more
        assert accepts("127.0.0.1", port)  # loopback stays
        await agent.apply_config(config(3, "127.0.0.3"))  # same address: the listener stays
        assert accepts("127.0.0.3", port)
    finally:
        await agent.api.close()
        await agent.link.close()
