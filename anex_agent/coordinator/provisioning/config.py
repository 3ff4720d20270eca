"""Provisioning settings, parsed once at the edge from the coordinator's environment, and the
registry that builds a :class:`~anex_agent.providers.rentals.RentalProvider` for each configured provider.

| variable | default | meaning |
|---|---|---|
| ``ANEX_PROVISION_COORDINATOR_URL`` | unset | the coordinator URL rented machines join (``https://...``); provisioning is off without it |
| ``ANEX_PROVISION_BOOT_TIMEOUT`` | 900 | seconds a rented machine has to join and report ready |
| ``ANEX_PROVISION_MAX_ATTEMPTS`` | 5 | offers tried per round (:mod:`.policy`: a provision without retries has one) |
| ``ANEX_PROVISION_RECONCILE_INTERVAL`` | 60 | seconds between comparisons of the providers' rentals with the provisions |
| ``ANEX_PROVISION_BACKOFF`` | 2 | seconds before the first retry of a provider that was unavailable (doubles, up to 60; jittered: :mod:`.scheduler`) |
| ``ANEX_PROVISION_LEASE`` | 30 | seconds a coordinator holds a provision it works on (another takes over after a crash) |
| ``ANEX_PROVISION_POLL_INTERVAL`` | 1 | seconds between the scheduler's looks for provisions due (a retry) and a booting provision's looks for its node |
| ``ANEX_PROVISION_RETRY_*``, ``_DEADLINE_*``, ``_IDLE_*`` | see :mod:`.policy` | the recovery policy of provisions that do not say |
| ``ANEX_RUNPOD_REST_URL`` | ``https://rest.runpod.io/v1`` | RunPod's REST API, where pods are rented (offers come from ``ANEX_RUNPOD_URL``) |

Where each provider is reached: Vast.AI offers and rentals at ``ANEX_VASTAI_URL``; RunPod
offers at ``ANEX_RUNPOD_URL`` (GraphQL), pods at ``ANEX_RUNPOD_REST_URL``. The demo, the tests
and the benchmark point them at the fake providers (:mod:`anex_agent.testing.fake_providers`).

Provider keys are the selection's (``ANEX_VASTAI_API_KEY`` / ``ANEX_VASTAI_API_KEY_FILE``,
``ANEX_RUNPOD_API_KEY`` / ``ANEX_RUNPOD_API_KEY_FILE``, see :mod:`anex_agent.selection.config`):
a provider the selection can search is one the coordinator can rent from. Keys live only in
the provider configs (left out of ``repr``) and are never logged.

Registry: :data:`RENTAL_FACTORIES` builds, per provider, its :class:`~anex_agent.providers.rentals.RentalProvider`
from the selection's ``VastAIConfig`` / ``RunPodConfig`` (same key, same HTTP policy), importing
the client module only then; :func:`register` adds or replaces a factory (tests).
:func:`build_providers` builds every configured one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from anex_agent.coordinator.provisioning.policy import PolicyDefaults, RecoveryPolicy
from anex_agent.providers.rentals import RentalProvider
from anex_agent.errors import ConfigError, env_number
from anex_agent.selection.config import SelectionConfig

log = logging.getLogger(__name__)

def _vastai(config: Any, settings: "ProvisioningSettings") -> RentalProvider:
    from anex_agent.providers.vastai.rentals import VastAIRentals

    return VastAIRentals(config)


def _runpod(config: Any, settings: "ProvisioningSettings") -> RentalProvider:
    from anex_agent.providers.runpod.rentals import RunPodRentalConfig, RunPodRentals

    return RunPodRentals(RunPodRentalConfig.from_source(config, settings.runpod_rest_url))


RENTAL_FACTORIES: dict[str, Callable[[Any, Any], RentalProvider]] = {"vastai": _vastai, "runpod": _runpod}


def register(name: str, factory: Callable[[Any, Any], RentalProvider]) -> None:
    """Use ``factory(selection_config, provisioning_settings)`` to build the rental provider ``name``."""
    RENTAL_FACTORIES[name] = factory


def build_providers(selection: SelectionConfig, settings: "ProvisioningSettings | None" = None,
                    ) -> dict[str, RentalProvider]:
    """A rental provider for every provider the selection has keys for and this build can rent from."""
    settings = settings or ProvisioningSettings()
    out: dict[str, RentalProvider] = {}
    for name, config in (("vastai", selection.vastai), ("runpod", selection.runpod)):
        if config is None:
            continue
        factory = RENTAL_FACTORIES.get(name)
        try:
            if factory is None:
                raise ImportError(name)
            out[name] = factory(config, settings)
        except ImportError:
            log.warning("provisioning: %s is configured for selection but this build cannot rent from it", name)
    return out


@dataclass(frozen=True)
class ProvisioningSettings:
    coordinator_url: str = ""  # what rented machines join; empty: the boot env has no URL (tests inject issuers)
    boot_timeout: float = 900.0
    max_attempts: int = 5
    reconcile_interval: float = 60.0
    poll_interval: float = 1.0  # how often the scheduler looks for due provisions, booting ones for their node
    backoff: float = 2.0  # first retry delay after a provider was unavailable; doubles, up to backoff_max
    backoff_max: float = 60.0
    rent_tries: int = 6  # rent calls per attempt while the provider is unavailable, then the next candidate
    lease: float = 30.0  # seconds a coordinator holds a provision it drives (renewed while it works on it)
    lost_after: int = 2  # reconciliations in a row a rental must be missing from its provider's list to be lost
    runpod_rest_url: str = "https://rest.runpod.io/v1"  # where RunPod pods are rented
    policy: RecoveryPolicy = RecoveryPolicy()  # the recovery policy of provisions that do not say (policy.py)
    status_interval: float = 10.0  # seconds between looks at a booting machine's status at its provider

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ProvisioningSettings:
        url = environ.get("ANEX_PROVISION_COORDINATOR_URL", "").strip()
        if url and not url.startswith(("http://", "https://")):
            raise ConfigError("ANEX_PROVISION_COORDINATOR_URL", f"{url!r} is not an http(s) URL")
        rest = environ.get("ANEX_RUNPOD_REST_URL", "").strip()
        if rest and not rest.startswith(("http://", "https://")):
            raise ConfigError("ANEX_RUNPOD_REST_URL", f"{rest!r} is not an http(s) URL")
        return cls(
            coordinator_url=url.rstrip("/"),
            boot_timeout=env_number(environ, "ANEX_PROVISION_BOOT_TIMEOUT", 900.0, minimum=10),
            max_attempts=int(env_number(environ, "ANEX_PROVISION_MAX_ATTEMPTS", 5, minimum=1, integer=True)),
            reconcile_interval=env_number(environ, "ANEX_PROVISION_RECONCILE_INTERVAL", 60.0, minimum=1),
            lease=env_number(environ, "ANEX_PROVISION_LEASE", 30.0, minimum=1),
            poll_interval=env_number(environ, "ANEX_PROVISION_POLL_INTERVAL", 1.0, minimum=0.05),
            backoff=env_number(environ, "ANEX_PROVISION_BACKOFF", 2.0, minimum=0.05),
            runpod_rest_url=rest.rstrip("/") or cls.runpod_rest_url,
            policy=PolicyDefaults.from_env(environ).policy,
        )
