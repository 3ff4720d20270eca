"""The simulated provider: rentals from a local rental service (the demo's, tests'), over HTTP.

Enabled with ``ANEX_PROVISION_SIMULATOR_URL`` (an ``http://`` URL). The service
(:mod:`anex_agent.demo.rentals`) answers:

    GET    /offers             -> {"offers": [{"offer_id", "machine_id", "price_per_hour", "gpu_name", "gpu_count"}]}
    POST   /rentals            {"offer_id", "label", "image", "env", "command", "onstart", "ports", "disk_gb"}
                               -> 201 {"rental_id", "label", "offer_id", "price_per_hour", "status"}
    GET    /rentals?label_prefix=P -> {"rentals": [...]}
    DELETE /rentals/{id}       -> 204 (404: already gone)

Errors follow the provider contract (:mod:`.rentals`): 4xx on a rent (but 408/429) is
:class:`RentRefused`; 408, 429, 5xx, timeouts and lost connections are
:class:`ProviderUnavailable`; a 404 on a destroy is success.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from anex_agent.coordinator.provisioning.rentals import ProviderUnavailable, Rental, RentRefused, RentRequest
from anex_agent.selection.annotations import Filters
from anex_agent.selection.offers import Offer, OfferTable

NAME = "simulated"
TIMEOUT = aiohttp.ClientTimeout(total=15)


def _unavailable(status: int) -> bool:
    return status in (408, 429) or status >= 500


def _retry_after(response: aiohttp.ClientResponse) -> float | None:
    raw = response.headers.get("Retry-After", "")
    return float(raw) if raw.isdigit() else None


def _rental(raw: dict[str, Any]) -> Rental:
    return Rental(provider=NAME, rental_id=str(raw["rental_id"]), label=str(raw.get("label", "")),
                  offer_id=raw.get("offer_id"), price_per_hour=raw.get("price_per_hour"),
                  status=str(raw.get("status", "unknown")))


class SimulatedRentals:
    """:class:`~.rentals.RentalProvider` of the simulated service."""

    name = NAME

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")

    async def _call(self, method: str, path: str, **kw: Any) -> tuple[int, Any, float | None]:
        try:
            async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
                async with session.request(method, self.base_url + path, **kw) as response:
                    body = await response.json(content_type=None) if response.content_length != 0 else None
                    return response.status, body, _retry_after(response)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as err:
            raise ProviderUnavailable(NAME, f"{method} {path}: {type(err).__name__}") from None

    async def rent(self, request: RentRequest) -> Rental:
        status, body, retry = await self._call("POST", "/rentals", json={
            "offer_id": request.offer_id, "label": request.label, "image": request.image, "env": dict(request.env),
            "command": list(request.command), "onstart": request.onstart, "ports": list(request.ports),
            "disk_gb": request.disk_gb, "gpu_count": request.gpu_count})
        if status in (200, 201):
            return _rental(body)
        reason = (body or {}).get("error", f"HTTP {status}") if isinstance(body, dict) else f"HTTP {status}"
        if _unavailable(status):
            raise ProviderUnavailable(NAME, f"rent answered {status}: {reason}", retry_after=retry)
        raise RentRefused(NAME, request.offer_id, str(reason))

    async def destroy(self, rental_id: str) -> None:
        status, _body, retry = await self._call("DELETE", f"/rentals/{rental_id}")
        if status in (200, 204, 404):
            return
        raise ProviderUnavailable(NAME, f"destroy answered {status}", retry_after=retry)

    async def list_rentals(self, label_prefix: str) -> list[Rental]:
        status, body, retry = await self._call("GET", "/rentals", params={"label_prefix": label_prefix})
        if status != 200 or not isinstance(body, dict):
            raise ProviderUnavailable(NAME, f"list answered {status}", retry_after=retry)
        return [_rental(r) for r in body.get("rentals", []) if str(r.get("label", "")).startswith(label_prefix)]


class SimulatedSource:
    """Offer source of the simulated service (asked afresh every time: there is no cache)."""

    name = NAME

    def __init__(self, base_url: str) -> None:
        self.rentals = SimulatedRentals(base_url)

    async def offers(self, filters: Filters) -> OfferTable:
        from anex_agent.selection.providers.http import ProviderError

        try:
            status, body, _ = await self.rentals._call("GET", "/offers")
        except ProviderUnavailable as err:
            raise ProviderError(NAME, err.reason, retryable=True) from None
        if status != 200 or not isinstance(body, dict):
            raise ProviderError(NAME, f"offers answered {status}", status=status, retryable=_unavailable(status))
        return OfferTable([Offer(provider=NAME, offer_id=str(o["offer_id"]), machine_id=o.get("machine_id"),
                                 gpu_name=o.get("gpu_name", ""), gpu_count=float(o.get("gpu_count", 1)),
                                 price=float(o.get("price_per_hour", 0.0)), disk_gb=float(o.get("disk_gb", 100.0)))
                           for o in body.get("offers", [])])
