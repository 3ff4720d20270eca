"""How GPU metrics are named on ``/metrics`` (agent and coordinator): parsed once, at each role's edge.

Two choices, both for dashboards built for different dcgm-exporter generations:

========================== ===================================== =================================
variable                   accepted                              default
========================== ===================================== =================================
ANEX_METRICS_HOST_LABEL    ``hostname`` | ``Hostname``           ``hostname`` (dcgm-exporter's
                                                                 label since it was renamed after
                                                                 its 4.x releases; ``Hostname`` is
                                                                 the older spelling)
ANEX_METRICS_PCIE_THROUGHPUT ``0`` | ``1``                       ``0``: only the current
                                                                 ``DCGM_FI_PROF_PCIE_TX_BYTES`` /
                                                                 ``_RX_BYTES`` (bytes/s); ``1``
                                                                 also the deprecated
                                                                 ``DCGM_FI_DEV_PCIE_TX_THROUGHPUT``
                                                                 / ``_RX_THROUGHPUT`` (KB/s)
========================== ===================================== =================================

A leaf beside the wire models (:mod:`anex_agent.wire`): no I/O, no import of any role.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from anex_agent import parse
from anex_agent.errors import ConfigError, env_value

HOST_LABELS = ("hostname", "Hostname")
HOST_LABEL_VAR = "ANEX_METRICS_HOST_LABEL"
PCIE_THROUGHPUT_VAR = "ANEX_METRICS_PCIE_THROUGHPUT"


@dataclass(frozen=True)
class ExpositionOptions:
    #: the label carrying the node's host name on every GPU and node series
    host_label: str = "hostname"
    #: also expose the deprecated DCGM_FI_DEV_PCIE_{TX,RX}_THROUGHPUT pair (KB/s)
    pcie_throughput: bool = False

    def __post_init__(self) -> None:
        if self.host_label not in HOST_LABELS:
            raise ConfigError(HOST_LABEL_VAR, f"is {self.host_label!r}; expected one of {', '.join(HOST_LABELS)}")


DEFAULT = ExpositionOptions()


def exposition_options(environ: Mapping[str, str]) -> ExpositionOptions:
    """The options from the environment (``ConfigError`` naming the variable for a bad value)."""
    host = environ.get(HOST_LABEL_VAR, "").strip() or DEFAULT.host_label
    if host not in HOST_LABELS:
        raise ConfigError(HOST_LABEL_VAR, f"is {host!r}; expected one of {', '.join(HOST_LABELS)}")
    pcie = env_value(environ, PCIE_THROUGHPUT_VAR, parse.boolean, False)
    return ExpositionOptions(host_label=host, pcie_throughput=pcie)
