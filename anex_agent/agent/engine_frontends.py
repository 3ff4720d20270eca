"""What the workload is offered, in the engine contract's terms: a WorkloadConfig from config + settings.

The data plane gives every engine a :class:`~anex_agent.tunnels.engines.config.WorkloadConfig`
with each ``apply()``: the proxy address (``ANEX_PROXY_LISTEN``) and whether it asks for
credentials (``ANEX_PROXY_AUTH``), the same for the SOCKS5 proxy when it is on
(``ANEX_SOCKS_LISTEN``, ``ANEX_SOCKS_AUTH``), the forwards (``GW_TUNNEL_*`` and pushed tunnels, local
settings winning on a port clash), the inbound TCP and UDP ports (``ANEX_INBOUND_PORTS``), the cluster
DNS and the gateways' mesh addresses. Engines that give a dialer ignore it (the agent's
proxy and forwards serve the workload); engines with front-ends of their own (wireproxy)
render it, so a pushed tunnel is just a changed config.

:func:`check_settings` asks the chosen engine, before anything starts, whether it can
serve what the settings ask for, and names the variable when it cannot.
"""

from __future__ import annotations

from anex_agent.agent.desired import merge_tunnels
from anex_agent.agent.settings import AgentSettings
from anex_agent.errors import ConfigError
from anex_agent.tunnels.engines.base import Engine
from anex_agent.tunnels.engines.config import Forward, WorkloadConfig
from anex_agent.wire.nodes import NodeConfig

#: WorkloadConfig field -> the setting a user changes.
SETTING_FOR_FIELD = {
    "proxy_address": "ANEX_PROXY_LISTEN",
    "proxy_auth": "ANEX_PROXY_AUTH",
    "socks_address": "ANEX_SOCKS_LISTEN",
    "socks_auth": "ANEX_SOCKS_AUTH",
    "forwards": "GW_TUNNEL_<port>",
    "inbound_ports": "ANEX_INBOUND_PORTS",
    "inbound_udp_ports": "ANEX_INBOUND_PORTS",
}


def workload_config(config: NodeConfig | None, settings: AgentSettings) -> WorkloadConfig:
    """The WorkloadConfig for ``config`` (None: before the first config, from the settings alone)."""
    tunnels = merge_tunnels(settings.tunnel_specs, config.tunnels if config is not None else [])
    return WorkloadConfig(
        proxy_address=str(settings.proxy_listen),
        proxy_auth=settings.proxy_auth is not None,
        socks_address=str(settings.socks_listen) if settings.socks_listen is not None else "",
        socks_auth=settings.socks_auth is not None,
        forwards=tuple(Forward(t.listen_port, str(t.target)) for t in tunnels),
        inbound_ports=tuple(settings.inbound_ports),
        inbound_udp_ports=tuple(settings.inbound_udp_ports),
        dns=tuple(config.dns) if config is not None else (),
        gateways=tuple(g.mesh_address for g in config.gateways if g.mesh_address) if config is not None else (),
    )


def check_settings(settings: AgentSettings, engine_cls: type[Engine]) -> None:
    """ConfigError naming the variable when ``engine_cls`` cannot serve what ``settings`` ask for."""
    try:
        engine_cls.check_workload(workload_config(None, settings))
    except ConfigError as err:
        raise ConfigError(SETTING_FOR_FIELD.get(err.source, err.source), err.message) from None
