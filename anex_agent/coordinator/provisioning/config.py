"""Provisioning settings, parsed once at the edge from the coordinator's environment, and the
registry that builds a :class:`~.rentals.RentalProvider` for each configured provider.

| variable | default | meaning |
|---|---|---|
| ``ANEX_PROVISION_COORDINATOR_URL`` | unset | the coordinator URL rented machines join (``https://...``); provisioning is off without it |
| ``ANEX_PROVISION_BOOT_TIMEOUT`` | 900 | seconds a rented machine has to join and report ready |
| ``ANEX_PROVISION_MAX_ATTEMPTS`` | 5 | offers tried per provision before it fails |
| ``ANEX_PROVISION_RECONCILE_INTERVAL`` | 60 | seconds between comparisons of the providers' rentals with the provisions |
| ``ANEX_PROVISION_LEASE`` | 30 | seconds a coordinator holds a provision it works on (another takes over after a crash) |
| ``ANEX_PROVISION_SIMULATOR_URL`` | unset | a simulated provider (``anex-agent demo``, tests): rentals from a local service |

Provider keys are the selection's (``ANEX_VASTAI_API_KEY`` / ``ANEX_VASTAI_API_KEY_FILE``,
``ANEX_RUNPOD_API_KEY`` / ``ANEX_RUNPOD_API_KEY_FILE``, see :mod:`anex_agent.selection.config`):
a provider the selection can search is one the coordinator can rent from. Keys live only in
the provider configs (left out of ``repr``) and are never logged.

Registry: :data:`RENTAL_FACTORIES` builds, per provider, its :class:`~.rentals.RentalProvider`
from the selection's ``VastAIConfig`` / ``RunPodConfig`` (same key, same HTTP policy), importing
the client module only then; :func:`register` adds or replaces a factory (tests).
:func:`build_providers` builds every configured one.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from anex_agent.coordinator.provisioning.rentals import RentalProvider
from anex_agent.errors import ConfigError
from anex_agent.selection.config import SelectionConfig

log = logging.getLogger(__name__)

def _vastai(config: Any) -> RentalProvider:
    from anex_agent.coordinator.provisioning.vastai import VastAIRentals

    return VastAIRentals(config)


def _runpod(config: Any) -> RentalProvider:
    from anex_agent.coordinator.provisioning.runpod import RunPodRentalConfig, RunPodRentals

    return RunPodRentals(RunPodRentalConfig.from_source(config))


RENTAL_FACTORIES: dict[str, Callable[[Any], RentalProvider]] = {"vastai": _vastai, "runpod": _runpod}


def register(name: str, factory: Callable[[Any], RentalProvider]) -> None:
    """Use ``factory(config)`` to build the rental provider ``name``."""
    RENTAL_FACTORIES[name] = factory


def build_providers(selection: SelectionConfig) -> dict[str, RentalProvider]:
    """A rental provider for every provider the selection has keys for and this build can rent from."""
    out: dict[str, RentalProvider] = {}
    for name, config in (("vastai", selection.vastai), ("runpod", selection.runpod)):
        if config is None:
            continue
        factory = RENTAL_FACTORIES.get(name)
        try:
            if factory is None:
                raise ImportError(name)
            out[name] = factory(config)
        except ImportError:
            log.warning("provisioning: %s is configured for selection but this build cannot rent from it", name)
    return out


@dataclass(frozen=True)
class ProvisioningSettings:
    coordinator_url: str = ""  # what rented machines join; empty: the boot env has no URL (tests inject issuers)
    boot_timeout: float = 900.0
    max_attempts: int = 5
    reconcile_interval: float = 60.0
    poll_interval: float = 1.0  # how often booting provisions look for their node
    backoff: float = 2.0  # first retry delay after a provider was unavailable; doubles, up to backoff_max
    backoff_max: float = 60.0
    rent_tries: int = 6  # rent calls per attempt while the provider is unavailable, then the next candidate
    lease: float = 30.0  # seconds a coordinator holds a provision it drives (renewed while it works on it)
    lost_after: int = 2  # reconciliations in a row a rental must be missing from its provider's list to be lost
    simulator_url: str = ""  # the simulated provider's service (demo, tests); empty: none

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ProvisioningSettings:
        def number(name: str, default: float, *, minimum: float, integer: bool = False) -> float:
            raw = environ.get(name)
            if raw is None or raw == "":
                return default
            try:
                value = int(raw) if integer else float(raw)
            except ValueError:
                value = math.nan
            if not math.isfinite(value) or value < minimum:
                kind = "an integer" if integer else "a number"
                raise ConfigError(name, f"{raw!r} is not valid; accepted: {kind} >= {minimum:g}")
            return value

        url = environ.get("ANEX_PROVISION_COORDINATOR_URL", "").strip()
        if url and not url.startswith(("http://", "https://")):
            raise ConfigError("ANEX_PROVISION_COORDINATOR_URL", f"{url!r} is not an http(s) URL")
        sim = environ.get("ANEX_PROVISION_SIMULATOR_URL", "").strip()
        if sim and not sim.startswith("http://"):
            raise ConfigError("ANEX_PROVISION_SIMULATOR_URL", f"{sim!r} is not an http:// URL")
        return cls(
            coordinator_url=url.rstrip("/"),
            boot_timeout=number("ANEX_PROVISION_BOOT_TIMEOUT", 900.0, minimum=10),
            max_attempts=int(number("ANEX_PROVISION_MAX_ATTEMPTS", 5, minimum=1, integer=True)),
            reconcile_interval=number("ANEX_PROVISION_RECONCILE_INTERVAL", 60.0, minimum=1),
            lease=number("ANEX_PROVISION_LEASE", 30.0, minimum=1),
            simulator_url=sim.rstrip("/"),
        )
