"""Front-ends served by the engine itself (wireproxy): its options from the node's config and settings.

wireproxy owns the HTTP proxy, one ``[TCPClientTunnel]`` per forward and one
``[TCPServerTunnel]`` per inbound port; the agent starts none of its own. This module
turns (NodeConfig, AgentSettings) into the :class:`~anex_agent.tunnels.wireproxy.WireproxyOptions`
the engine renders, so a pushed tunnel becomes a changed config (and wireproxy, which
has no live reconfiguration, a restart).
"""

from __future__ import annotations

import socket
from typing import Any

from anex_agent.agent.desired import merge_tunnels
from anex_agent.agent.settings import AgentSettings
from anex_agent.errors import ConfigError
from anex_agent.wire import NodeConfig


def free_loopback_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now (the kernel's pick), for wireproxy's ``-i``.

    Another process could take it before wireproxy binds it; wireproxy then exits and the
    engine's supervisor restarts it (with the same address), which is reported.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def check_settings(settings: AgentSettings) -> None:
    """Settings the engine-served front-ends cannot honour: ConfigError naming the variable."""
    if settings.proxy_auth is not None:
        raise ConfigError("ANEX_PROXY_AUTH", "is not supported with the wireproxy engine (its proxy is served by "
                                             "wireproxy); unset it or use another engine")


def wireproxy_options(config: NodeConfig, settings: AgentSettings, health_address: str) -> Any:
    """WireproxyOptions for ``config``: proxy on ANEX_PROXY_LISTEN, a client tunnel per GW_TUNNEL_* and
    per pushed tunnel (local settings win on a port clash), a server tunnel per ANEX_INBOUND_PORTS port."""
    from anex_agent.tunnels.wireproxy import WireproxyOptions

    merged = config.model_copy(update={"tunnels": merge_tunnels(settings.tunnel_specs, config.tunnels)})
    return WireproxyOptions.for_node(merged, proxy_address=str(settings.proxy_listen), health_address=health_address,
                                     inbound_ports=settings.inbound_ports)
