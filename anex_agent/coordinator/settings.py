"""The coordinator's configuration, parsed once at the edge (CLI) into a frozen dataclass.

Secrets (the database password, the admin token) are fields left out of ``repr``; a
password written into ``database_url`` is moved to ``database_password`` on construction,
so the URL itself is safe to show.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from anex_agent.coordinator.db import split_password
from anex_agent.coordinator.ipam import Pool
from anex_agent.coordinator.limits import Limits
from anex_agent.coordinator.states import Timings
from anex_agent.wire.route_policy import DEFAULT_GATEWAY_ROUTES
from anex_agent.errors import ConfigError
from anex_agent.telemetry.options import ExpositionOptions

DEFAULT_LISTEN = "127.0.0.1:8700"
DEFAULT_NETWORK = "10.254.0.0/16"
DEFAULT_MTU = 1420  # WireGuard's usual MTU: 1500 - 80 bytes of IPv6+UDP+WireGuard overhead


def default_state_dir(environ: dict[str, str] | None = None) -> Path:
    """``$ANEX_STATE_DIR/coordinator`` when set, else ``./state/coordinator``."""
    env = os.environ if environ is None else environ
    base = env.get("ANEX_STATE_DIR")
    return Path(base) / "coordinator" if base else Path("state") / "coordinator"


@dataclass(frozen=True)
class Settings:
    state_dir: Path
    database_url: str
    pool: Pool
    mtu: int = DEFAULT_MTU
    dns: tuple[str, ...] = ()  # empty: the gateways' mesh addresses (each gateway serves DNS)
    search_domains: tuple[str, ...] = ()
    timings: Timings = field(default_factory=Timings)
    address_quarantine: float = 3600.0
    access_token_ttl: int = 300
    heartbeat_flush_interval: float = 0.1
    poll_interval: float = 0.5
    sweep_interval: float = 1.0
    change_retention: int = 100_000
    persistent_keepalive: int = 25
    #: seconds without a sign of a gateway (its watch stream open, a call of its own) after
    #: which it is gone: left out of the nodes' configs until it is back (--gateway-gone-after)
    gateway_gone_after: float = 60.0
    limits: Limits = field(default_factory=Limits)
    metrics_token_file: Path | None = None  # else $ANEX_METRICS_TOKEN; none: /metrics needs the admin token
    gateway_routes: tuple[str, ...] = DEFAULT_GATEWAY_ROUTES  # networks gateways may offer (--gateway-route)
    #: PostgreSQL password (secret); None: the URL's, else $PGPASSWORD / $PGPASSFILE as asyncpg reads them
    database_password: str | None = field(default=None, repr=False)
    #: the admin token from ANEX_ADMIN_TOKEN(_FILE) (secret); None: <state_dir>/admin-token
    admin_token: str | None = field(default=None, repr=False)
    #: the metrics token from ANEX_METRICS_TOKEN (secret); --metrics-token-file is read at start
    metrics_token: str | None = field(default=None, repr=False)
    #: remote access (docs/remote-access.md): the SSH CA key file (None: <state_dir>/ssh-ca-key), the
    #: older CA public keys still trusted during a rotation, and user certificate lifetimes (seconds)
    ssh_ca_key_file: Path | None = None
    ssh_ca_previous: tuple[str, ...] = ()
    ssh_certificate_ttl: int = 600
    ssh_certificate_max_ttl: int = 3600
    ssh_issuer_token_file: Path | None = None  # a token (0600 file) good only for SSH user certificates
    #: certificate chain and key (PEM) when the coordinator serves HTTPS itself
    tls_cert: Path | None = None
    tls_key: Path | None = None
    #: GPU metric naming on the fleet /metrics (ANEX_METRICS_HOST_LABEL, ANEX_METRICS_PCIE_THROUGHPUT)
    gpu_metrics: ExpositionOptions = field(default_factory=ExpositionOptions)
    #: single-file agents served on GET /v1/agent/{arch} (--agent-binary): (arch, path) pairs
    agent_binaries: tuple[tuple[str, Path], ...] = ()

    def __post_init__(self) -> None:
        bare, password = split_password(self.database_url)
        if password is not None:
            if self.database_password is not None:
                raise ConfigError("--database", "holds a password and a database password is also given; give it once")
            object.__setattr__(self, "database_url", bare)
            object.__setattr__(self, "database_password", password)

    @classmethod
    def for_tests(cls, state_dir: Path, database_url: str | None = None, **overrides) -> Settings:
        return cls(
            state_dir=state_dir,
            database_url=database_url or f"sqlite:///{state_dir / 'coordinator.db'}",
            pool=Pool.parse(overrides.pop("network", DEFAULT_NETWORK)),
            **overrides,
        )
