"""Vast.AI rentals (``https://console.vast.ai/api/v0``, API key as ``Authorization: Bearer``).

* rent: ``PUT /asks/{offer_id}/`` with ``{"client_id": "me", "image", "env", "disk" (GB),
  "label", "runtype", "onstart"?, "args"?, "price"?}``; the answer ``{"success": true,
  "new_contract": <instance id>}``. ``env`` is the API's dict form of docker options: one
  ``NAME: value`` per variable and ``"-p PORT:PORT": "1"`` per published port (what the
  vast CLI makes of ``--env '-e K=V -p P:P'``). With a start script (``onstart``) the
  runtype is ``ssh``, as upstream rents (Vast.AI runs the script at container start);
  without one it is ``args``: the image's own entrypoint runs with the command as its
  arguments (the agent image). ``price`` (USD/hour) makes it an interruptible instance bidding
  that much (``anex.sh/interruptible``: the offer's price the selection chose); a higher bid
  takes the machine: the instance is then listed ``intended_status``/``actual_status``
  ``stopped`` (the loop's event ``interruption``). A private image's registry login is
  ``"image_login": "-u USER -p PASSWORD SERVER"`` (the arguments of ``docker login``, as the vast
  CLI's ``--login`` sends them).
* destroy: ``DELETE /instances/{id}/``; 404 (or ``no_such_instance``) means already gone.
* list: ``GET /instances/?owner=me`` -> ``{"instances": [...]}``, kept when ``label``
  starts with the prefix; the price is the instance's ``dph_total`` (USD/hour).

Errors (:mod:`anex_agent.providers.rentals_http`): a 4xx about the offer (``no_such_ask``, already rented, bad
request), or ``"success": false`` in a 2xx answer, is :class:`RentRefused`; 401/403, 429, 5xx,
timeouts and an answer without ``new_contract`` are :class:`ProviderUnavailable` (the
instance may exist: the loop lists by label before renting again). The API key is only
ever in a header, never logged.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping

from anex_agent import parse
from anex_agent.providers import rentals_http as provider_http
from anex_agent.providers.rentals import ProviderUnavailable, Rental, RentRefused, RentRequest
from anex_agent.providers.offers_http import JsonClient, ProviderError
from anex_agent.providers.vastai.offers import VastAIConfig

log = logging.getLogger(__name__)

NAME = "vastai"
GONE_ERRORS = frozenset({"no_such_instance", "not_found", "no_such_contract"})


def docker_env(env: Mapping[str, str], ports: tuple[int, ...]) -> dict[str, str]:
    """The ``env`` field of a rent: the variables, and ``"-p P:P": "1"`` per published port."""
    out = {str(name): str(value) for name, value in env.items()}
    for port in ports:
        out[f"-p {int(port)}:{int(port)}"] = "1"
    return out


def rent_body(request: RentRequest) -> dict:
    """The JSON body of ``PUT /asks/{offer_id}/`` for ``request``."""
    body: dict = {
        "client_id": "me",
        "image": request.image,
        "env": docker_env(request.env, request.ports),
        "disk": max(1, math.ceil(request.disk_gb)),
        "label": request.label,
    }
    if request.registry_login is not None:
        login = request.registry_login
        # docker login's words, split at spaces: RegistryAuth refuses spaces, control characters, a leading '-'
        body["image_login"] = f"-u {login.username} -p {login.password} {login.server}"
    if request.interruptible and request.bid_per_hour is not None:
        body["price"] = round(float(request.bid_per_hour), 6)  # a bid: an interruptible instance
    if request.onstart is not None:
        body["runtype"] = "ssh"
        body["onstart"] = request.onstart
    else:
        body["runtype"] = "args"
        if request.command:
            body["args"] = list(request.command)
    return body


def rental_from_instance(raw: Mapping) -> Rental:
    """One entry of ``GET /instances/`` as a :class:`Rental`."""
    price = raw.get("dph_total")
    return Rental(
        provider=NAME,
        rental_id=str(raw.get("id")),
        label=str(raw.get("label") or ""),
        offer_id=None,
        price_per_hour=float(price) if isinstance(price, (int, float)) and not isinstance(price, bool) else None,
        status=str(raw.get("actual_status") or raw.get("cur_state") or "unknown"),
        details={key: raw.get(key) for key in ("machine_id", "actual_status", "intended_status", "cur_state",
                                                "gpu_name", "num_gpus", "public_ipaddr", "status_msg", "is_bid")
                 if raw.get(key) is not None},
    )


class VastAIRentals(provider_http.ProviderClient):
    """:class:`~.rentals.RentalProvider` for Vast.AI. Close with :meth:`aclose`."""

    name = NAME

    def __init__(self, config: VastAIConfig, *, clients: tuple[JsonClient, JsonClient] | None = None) -> None:
        self.config = config
        super().__init__(NAME, config.base_url, config.api_key, config.policy, clients)

    async def rent(self, request: RentRequest) -> Rental:
        offer = str(request.offer_id)
        if not parse.is_integer(offer):
            raise RentRefused(NAME, offer, "a Vast.AI offer id is a number")
        try:
            answer = await self._rent_client.request("PUT", self._url(f"asks/{offer}/"), body=rent_body(request),
                                                     headers=self._headers())
        except ProviderError as err:
            raise provider_http.refused_or_unavailable(err, offer, f"renting offer {offer}") from None
        if isinstance(answer, dict) and answer.get("success") is False:
            raise RentRefused(NAME, offer, provider_http.error_text(_json_text(answer)))
        contract = answer.get("new_contract") if isinstance(answer, dict) else None
        if not isinstance(contract, (int, str)) or isinstance(contract, bool) or not str(contract):
            # it may have been created: the loop lists by label before renting again
            raise ProviderUnavailable(NAME, f"renting offer {offer}: the answer names no new_contract")
        rental_id = str(contract)
        log.info("vastai: rented offer %s as instance %s (%s)", offer, rental_id, request.label)
        found = await self._find(rental_id)
        return Rental(
            provider=NAME, rental_id=rental_id, label=request.label, offer_id=offer,
            price_per_hour=found.price_per_hour if found else None,
            status=found.status if found else "created", details=dict(found.details) if found else {},
        )

    async def _find(self, rental_id: str) -> Rental | None:
        """The new instance as listed, for its price; None when the listing fails or lags."""
        try:
            rentals = await self._instances()
        except ProviderUnavailable as err:
            log.debug("vastai: could not read instance %s after renting it: %s", rental_id, err.reason)
            return None
        return next((r for r in rentals if r.rental_id == rental_id), None)

    async def destroy(self, rental_id: str) -> None:
        if not parse.is_integer(str(rental_id)):
            raise ValueError(f"a Vast.AI instance id is a number, not {rental_id!r}")
        try:
            answer = await self._client.request("DELETE", self._url(f"instances/{rental_id}/"), headers=self._headers())
        except ProviderError as err:
            if err.status in (404, 410) or _error_code(err.body) in GONE_ERRORS:
                log.info("vastai: instance %s was already gone", rental_id)
                return
            raise provider_http.unavailable(err, f"destroying instance {rental_id}") from None
        if isinstance(answer, dict) and answer.get("success") is False:
            if str(answer.get("error") or "") in GONE_ERRORS:
                return
            raise ProviderUnavailable(NAME, f"destroying instance {rental_id}: "
                                            f"{provider_http.error_text(_json_text(answer))}")
        log.info("vastai: destroyed instance %s", rental_id)

    async def list_rentals(self, label_prefix: str) -> list[Rental]:
        return [r for r in await self._instances() if r.label.startswith(label_prefix)]

    async def _instances(self) -> list[Rental]:
        try:
            answer = await self._client.request("GET", self._url("instances/"), params={"owner": "me"},
                                                headers=self._headers())
        except ProviderError as err:
            raise provider_http.unavailable(err, "listing instances") from None
        if not isinstance(answer, dict) or not isinstance(answer.get("instances"), list):
            raise ProviderUnavailable(NAME, "listing instances: the answer has no 'instances' list")
        return [rental_from_instance(raw) for raw in answer["instances"]
                if isinstance(raw, dict) and raw.get("id") is not None]


def _json_text(doc: object) -> str:
    return json.dumps(doc)


def _error_code(body: str) -> str:
    try:
        doc = json.loads(body) if body else None
    except ValueError:
        return ""
    return str(doc.get("error") or "") if isinstance(doc, dict) else ""


__all__ = ["VastAIRentals", "docker_env", "rent_body", "rental_from_instance"]
