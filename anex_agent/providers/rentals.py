"""The contract between the provisioning loop and a provider that rents machines.

A *rental* is one paid machine (a Vast.AI instance, a RunPod pod). The loop asks a
:class:`RentalProvider` to rent one offer, to destroy one rental, and to list the
rentals that carry this cluster's label. Nothing else about a provider leaks into
the loop.

Contract of every :class:`RentalProvider`:

* ``rent(request)`` creates at most one rental and returns it. It raises
  :class:`RentRefused` when the provider refused *this offer* (taken, gone, a 4xx
  about the request): the loop moves to the next candidate. It raises
  :class:`ProviderUnavailable` when the outcome is unknown or temporary (429, 5xx,
  timeout, connection lost): the rental *may* exist, so before renting again the
  loop lists rentals by label and adopts one it finds (never pay twice).
  Two kinds of :class:`ProviderUnavailable` say more: :class:`KeyRefused` (401/403: the API
  key is wrong or lacks the right; no retry or other offer helps: the loop fails the
  provision) and :class:`NoCapacity` (a 5xx saying the provider has no machine for this offer,
  as RunPod answers: once listing shows nothing was rented, the loop tries the next candidate).
* ``request.interruptible``: rent interruptible / spot capacity, bidding ``request.bid_per_hour``
  where the provider takes a bid (Vast.AI); a rental the provider then stops (outbid,
  preempted) is listed with a status that says so (:func:`.recovery.interrupted`).
* Every rental carries ``request.label`` where the provider keeps a label, so
  :meth:`RentalProvider.list_rentals` finds it after a coordinator crash.
* ``destroy(rental_id)`` is idempotent: a rental that is already gone is success.
  It raises :class:`ProviderUnavailable` when it could not tell; the loop retries.
* ``list_rentals(label_prefix)`` returns every rental whose label starts with
  ``label_prefix`` (this cluster's rentals: :func:`cluster_label_prefix`).
* Providers never log API keys, and reuse the selection's HTTP client
  (:class:`anex_agent.providers.offers_http.JsonClient`: retries,
  ``Retry-After``, timeouts).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from anex_agent.errors import AnexError

LABEL_PREFIX = "anex"


def cluster_label_prefix(cluster_id: str) -> str:
    """The label prefix every rental of this cluster carries: ``anex:<cluster_id>:``."""
    return f"{LABEL_PREFIX}:{cluster_id}:"


def rental_label(cluster_id: str, provision_id: str) -> str:
    """The label of the rental made for one provision: ``anex:<cluster_id>:<provision_id>``."""
    return cluster_label_prefix(cluster_id) + provision_id


def provision_of_label(label: str, cluster_id: str) -> str | None:
    """The provision id a label names, or None when the label is not this cluster's."""
    prefix = cluster_label_prefix(cluster_id)
    return (label[len(prefix):] or None) if label.startswith(prefix) else None


@dataclass(frozen=True)
class RegistryLogin:
    """The login to the registry of a private image, opened for one rent; never logged."""

    server: str
    username: str
    password: str = field(repr=False)
    fingerprint: str = ""  # an HMAC of the login (registry_auth.fingerprint): a name that says nothing of it


@dataclass(frozen=True)
class RentRequest:
    """What to rent and what to run on it."""

    provision_id: str
    label: str  # rental_label(cluster_id, provision_id)
    offer_id: str  # the provider's id of the offer the selection chose
    image: str
    env: Mapping[str, str]  # the workload's environment plus the agent's boot variables
    command: tuple[str, ...] = ()  # the pod's command and args (run under the agent)
    onstart: str | None = None  # a start script, for images without the agent as entrypoint
    ports: tuple[int, ...] = ()
    disk_gb: float = 20.0
    gpu_count: int = 1
    interruptible: bool = False  # interruptible (Vast.AI: a bid) or spot (RunPod) capacity
    bid_per_hour: float | None = None  # interruptible: the price to bid, USD/hour (the selection's offer price)
    registry_login: RegistryLogin | None = None  # a private image's registry (Vast.AI image_login, RunPod auth id)


@dataclass(frozen=True)
class Rental:
    """One rental as the provider reports it."""

    provider: str
    rental_id: str
    label: str
    offer_id: str | None = None
    price_per_hour: float | None = None  # USD
    status: str = "unknown"  # the provider's own word (running, loading, exited, ...)
    details: Mapping[str, object] = field(default_factory=dict)


class RentRefused(AnexError):
    """The provider refused to rent this offer; another candidate may succeed."""

    def __init__(self, provider: str, offer_id: str, reason: str) -> None:
        self.provider, self.offer_id, self.reason = provider, offer_id, reason
        super().__init__(f"{provider} refused offer {offer_id}: {reason}")


class ProviderUnavailable(AnexError):
    """The provider could not be asked, or its answer is unknown; try again later."""

    def __init__(self, provider: str, reason: str, *, retry_after: float | None = None) -> None:
        self.provider, self.reason, self.retry_after = provider, reason, retry_after
        super().__init__(f"{provider} unavailable: {reason}")


class KeyRefused(ProviderUnavailable):
    """The provider refused the API key (HTTP 401/403): nothing works until the key is fixed."""


class NoCapacity(ProviderUnavailable):
    """The provider answered a server error saying it has no machine for the offer (nothing was rented,
    as far as it says: list before believing it)."""


class RentalProvider(Protocol):
    name: str

    async def rent(self, request: RentRequest) -> Rental: ...

    async def destroy(self, rental_id: str) -> None: ...

    async def list_rentals(self, label_prefix: str) -> list[Rental]: ...
