"""RunPod rentals through its REST API (``https://rest.runpod.io/v1``, API key as
``Authorization: Bearer``).

Why REST and not GraphQL's ``podFindAndDeployOnDemand``: REST answers with HTTP statuses that
map straight onto the rental contract (a 4xx refuses the offer, 429/5xx leave it unknown),
where GraphQL answers 200 with an ``errors`` list whose messages would have to be parsed;
``DELETE /pods/{id}`` says "already gone" with a plain 404; and ``POST /pods`` takes the
exact GPU type, data center and cloud tier the selection chose (its offer id), where the
GraphQL mutation picks a machine by itself within looser filters.

* rent: ``POST /pods`` with ``{"name": label, "imageName", "gpuTypeIds": [type],
  "gpuCount", "cloudType": "SECURE"|"COMMUNITY", "dataCenterIds": [dc], "env": {..},
  "ports": ["P/tcp"], "containerDiskInGb", "interruptible": false}``; with a start script
  ``"dockerEntrypoint": ["/bin/sh", "-c", script]`` (RunPod has no separate on-start hook),
  else ``"dockerStartCmd": command`` for the image's own entrypoint. A private image's registry
  login is saved at RunPod first (``POST /containerregistryauth`` ``{"name", "username",
  "password"}`` -> ``{"id", "name"}``, once per login: its name is the login's fingerprint and
  ``GET /containerregistryauth`` finds it again) and the pod names it
  (``"containerRegistryAuthId"``). Saved logins stay in the account (one per login, not per rent). The answer is the Pod
  (``id``, ``name``, ``costPerHr``, ``adjustedCostPerHr``, ``desiredStatus``, ``machineId``).
  The offer id is the selection's ``<gpu type id>@<data center>/<SECURE|COMMUNITY>/x<count>``
  (:mod:`anex_agent.providers.runpod.offers`).
* destroy: ``DELETE /pods/{id}``; 404 means already gone.
* list: ``GET /pods`` (a JSON array), kept when ``name`` starts with the prefix; the price is
  ``adjustedCostPerHr``, else ``costPerHr`` (USD/hour).

Errors as in :mod:`anex_agent.providers.rentals_http`. The API key is only ever in a header, never logged.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from anex_agent.providers import rentals_http as provider_http
from anex_agent.providers.rentals import (
    ProviderUnavailable, RegistryLogin, Rental, RentRefused, RentRequest,
)
from anex_agent.providers.offers_http import HttpPolicy, JsonClient, ProviderError
from anex_agent.providers.runpod.offers import RunPodConfig

log = logging.getLogger(__name__)

NAME = "runpod"
DEFAULT_REST_URL = "https://rest.runpod.io/v1"
_OFFER = re.compile(r"^(?P<gpu>.+)@(?P<dc>[A-Za-z0-9-]+)/(?P<tier>SECURE|COMMUNITY)/x(?P<count>[1-9][0-9]*)$")
_POD_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class RunPodRentalConfig:
    """The REST endpoint and the API key (the selection's ``--runpod-api-key``; never logged)."""

    api_key: str = field(default="", repr=False)
    rest_url: str = DEFAULT_REST_URL
    policy: HttpPolicy = HttpPolicy()

    @classmethod
    def from_source(cls, config: RunPodConfig, rest_url: str = DEFAULT_REST_URL) -> "RunPodRentalConfig":
        """The rental config beside the selection's (the same key and HTTP policy)."""
        return cls(api_key=config.api_key, rest_url=rest_url, policy=config.policy)


@dataclass(frozen=True)
class Offer:
    gpu_type_id: str
    datacenter_id: str
    cloud_type: str
    gpu_count: int


def parse_offer(offer_id: str) -> Offer | None:
    """The parts of a selection offer id, or None when it is not one."""
    match = _OFFER.match(offer_id)
    if match is None:
        return None
    return Offer(match["gpu"], match["dc"], match["tier"], int(match["count"]))


def registry_auth_name(login: RegistryLogin) -> str:
    """The name a login is saved under at RunPod: its fingerprint (an HMAC), so the same login is
    saved once and the name says nothing of it."""
    return f"anex-{login.fingerprint[:32]}"


def create_body(request: RentRequest, offer: Offer, registry_auth_id: str | None = None) -> dict:
    """The JSON body of ``POST /pods`` for ``request`` on ``offer`` (``containerRegistryAuthId``: the
    saved login to pull a private image with)."""
    body: dict = {
        "name": request.label,
        "imageName": request.image,
        "gpuTypeIds": [offer.gpu_type_id],
        "gpuCount": offer.gpu_count,
        "cloudType": offer.cloud_type,
        "dataCenterIds": [offer.datacenter_id],
        "env": {str(k): str(v) for k, v in request.env.items()},
        "ports": [f"{int(p)}/tcp" for p in request.ports],
        "containerDiskInGb": max(1, math.ceil(request.disk_gb)),
        "interruptible": bool(request.interruptible),  # spot capacity (anex.sh/interruptible)
    }
    if registry_auth_id is not None:
        body["containerRegistryAuthId"] = registry_auth_id
    if request.onstart is not None:
        body["dockerEntrypoint"] = ["/bin/sh", "-c", request.onstart]
        body["dockerStartCmd"] = []
    elif request.command:
        body["dockerStartCmd"] = list(request.command)
    return body


def _price(raw: Mapping) -> float | None:
    for key in ("adjustedCostPerHr", "costPerHr"):
        value = raw.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def rental_from_pod(raw: Mapping, offer_id: str | None = None) -> Rental:
    return Rental(
        provider=NAME,
        rental_id=str(raw.get("id")),
        label=str(raw.get("name") or ""),
        offer_id=offer_id,
        price_per_hour=_price(raw),
        status=str(raw.get("desiredStatus") or "unknown"),
        details={key: raw.get(key) for key in ("machineId", "costPerHr", "adjustedCostPerHr", "gpuCount", "image")
                 if raw.get(key) is not None},
    )


class RunPodRentals(provider_http.ProviderClient):
    """:class:`~.rentals.RentalProvider` for RunPod. Close with :meth:`aclose`."""

    name = NAME

    def __init__(self, config: RunPodRentalConfig, *, clients: tuple[JsonClient, JsonClient] | None = None) -> None:
        self.config = config
        super().__init__(NAME, config.rest_url, config.api_key, config.policy, clients)

    async def rent(self, request: RentRequest) -> Rental:
        offer = parse_offer(str(request.offer_id))
        if offer is None:
            raise RentRefused(NAME, str(request.offer_id),
                              "not a RunPod offer id (<gpu type>@<data center>/<SECURE|COMMUNITY>/x<count>)")
        auth_id = await self._registry_auth(request.registry_login) if request.registry_login is not None else None
        try:
            answer = await self._rent_client.request("POST", self._url("pods"),
                                                     body=create_body(request, offer, auth_id), headers=self._headers())
        except ProviderError as err:
            raise provider_http.refused_or_unavailable(err, request.offer_id, f"creating a pod for {request.offer_id}") \
                from None
        if not isinstance(answer, dict) or not answer.get("id"):
            raise ProviderUnavailable(NAME, f"creating a pod for {request.offer_id}: the answer names no pod id")
        rental = rental_from_pod(answer, request.offer_id)
        log.info("runpod: created pod %s for %s (%s)", rental.rental_id, request.offer_id, request.label)
        if rental.label != request.label:  # the pod is ours whatever name the answer echoes
            rental = replace(rental, label=request.label)
        return rental

    async def _registry_auth(self, login: RegistryLogin) -> str:
        """The id of ``login`` saved at RunPod (``GET /containerregistryauth``, else ``POST`` it)."""
        name = registry_auth_name(login)
        try:
            saved = await self._client.request("GET", self._url("containerregistryauth"), headers=self._headers())
            found = next((str(a["id"]) for a in saved if isinstance(a, dict) and a.get("name") == name
                          and a.get("id")), None) if isinstance(saved, list) else None
            if found is not None:
                return found
            made = await self._rent_client.request(
                "POST", self._url("containerregistryauth"), headers=self._headers(),
                body={"name": name, "username": login.username, "password": login.password})
        except ProviderError as err:
            raise provider_http.unavailable(err, f"saving the registry login for {login.server}") from None
        if not isinstance(made, dict) or not made.get("id"):
            raise ProviderUnavailable(NAME, "saving a registry login: the answer names no id")
        log.info("runpod: saved the registry login for %s as %s", login.server, name)
        return str(made["id"])

    async def destroy(self, rental_id: str) -> None:
        if not _POD_ID.match(str(rental_id)):
            raise ValueError(f"not a RunPod pod id: {rental_id!r}")
        try:
            await self._client.request("DELETE", self._url(f"pods/{rental_id}"), headers=self._headers())
        except ProviderError as err:
            if err.status in (404, 410):
                log.info("runpod: pod %s was already gone", rental_id)
                return
            raise provider_http.unavailable(err, f"terminating pod {rental_id}") from None
        log.info("runpod: terminated pod %s", rental_id)

    async def list_rentals(self, label_prefix: str) -> list[Rental]:
        try:
            answer = await self._client.request("GET", self._url("pods"), headers=self._headers())
        except ProviderError as err:
            raise provider_http.unavailable(err, "listing pods") from None
        if isinstance(answer, dict) and isinstance(answer.get("pods"), list):
            answer = answer["pods"]
        if not isinstance(answer, list):
            raise ProviderUnavailable(NAME, "listing pods: the answer is not a list")
        return [rental_from_pod(raw) for raw in answer
                if isinstance(raw, dict) and raw.get("id") and str(raw.get("name") or "").startswith(label_prefix)]


__all__ = ["RunPodRentalConfig", "RunPodRentals", "create_body", "parse_offer", "rental_from_pod"]
