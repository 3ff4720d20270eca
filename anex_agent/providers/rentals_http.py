"""What the rental providers share: their HTTP clients and the mapping of HTTP outcomes onto
the rental contract (:mod:`.rentals`).

* :func:`clients` makes the two :class:`~anex_agent.providers.offers_http.JsonClient` a
  provider uses, both without the answer cache (every rental call asks the provider):
  ``rent`` makes **one** attempt (a create that timed out or answered 5xx may have created
  the rental: the loop lists by label before renting again, the client never retries it
  blindly); ``calls`` (destroy, list: idempotent) retries 429/5xx/timeouts as the selection
  does, honouring ``Retry-After``.
* :func:`unavailable` and :func:`refused_or_unavailable` turn a
  :class:`~anex_agent.providers.offers_http.ProviderError` into the contract's errors:
  429, 5xx, timeouts and connection errors are :class:`.rentals.ProviderUnavailable` (with the
  provider's ``Retry-After``); a refused API key (401/403: no other offer would fare better)
  is :class:`.rentals.KeyRefused`; a 5xx whose body says there is no machine for the offer
  (RunPod's "no longer any instances available") is :class:`.rentals.NoCapacity`; any other
  4xx about a rent is :class:`.rentals.RentRefused` naming the provider's own error code and
  message.
* :func:`error_text` reads a provider's error body (``{"error": ..., "msg": ...}`` and
  similar) into one short line; it is only ever the provider's text, never the request.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

from anex_agent.providers.rentals import KeyRefused, NoCapacity, ProviderUnavailable, RentRefused
from anex_agent.providers.offers_http import HttpPolicy, JsonClient, ProviderError

REASON_LIMIT = 300  # characters of a provider's error text kept in a reason
AUTH_STATUSES = (401, 403)
#: what a provider's server error says when it has no machine for the offer
NO_CAPACITY = re.compile(r"no (longer )?(any )?(instances?|machines?|gpus?) (are )?available|out of (stock|capacity)|"
                         r"not enough (free )?gpus|insufficient capacity", re.IGNORECASE)


def clients(provider: str, policy: HttpPolicy) -> tuple[JsonClient, JsonClient]:
    """``(rent, calls)``: the client for creating a rental (one attempt) and the one for the
    idempotent calls (retries as ``policy`` says). Neither caches an answer."""
    uncached = replace(policy, cache_ttl=0.0)
    return JsonClient(provider, policy=replace(uncached, attempts=1)), JsonClient(provider, policy=uncached)


class ProviderClient:
    """What every provider's rental client shares: its two HTTP clients (:func:`clients`), URLs
    under ``base_url``, and the bearer-key headers. Close with :meth:`aclose`."""

    def __init__(self, provider: str, base_url: str, api_key: str, policy: HttpPolicy,
                 clients_: tuple[JsonClient, JsonClient] | None = None) -> None:
        self._base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._rent_client, self._client = clients_ or clients(provider, policy)

    async def aclose(self) -> None:
        await self._rent_client.close()
        await self._client.close()

    def _url(self, path: str) -> str:
        return f"{self._base_url}/{path.lstrip('/')}"

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers


def error_text(body: str) -> str:
    """One short line from a provider's error body: its error code and message when it is a
    JSON object (``error``/``msg``/``message``/``detail``), else the text itself."""
    text = body.strip()
    try:
        doc = json.loads(text) if text else None
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        parts = [str(doc[key]) for key in ("error", "msg", "message", "detail") if doc.get(key) not in (None, "")]
        text = ": ".join(dict.fromkeys(parts)) or text
    text = " ".join(text.split())
    return text[:REASON_LIMIT] or "no reason given"


def unavailable(err: ProviderError, what: str) -> ProviderUnavailable:
    """``err`` (any failure of ``what``) as :class:`ProviderUnavailable`."""
    if err.status in AUTH_STATUSES:
        return KeyRefused(err.provider, f"{what}: the API key was refused (HTTP {err.status}); check the "
                                        f"provider key", retry_after=err.retry_after)
    if err.status is not None and err.status >= 500 and err.body and NO_CAPACITY.search(err.body):
        return NoCapacity(err.provider, f"{what}: HTTP {err.status}: {error_text(err.body)}",
                          retry_after=err.retry_after)
    if err.status is not None and err.status < 500 and err.status != 429 and err.body:
        reason = f"{what}: HTTP {err.status}: {error_text(err.body)}"
    else:
        reason = f"{what}: {err}"
    return ProviderUnavailable(err.provider, reason, retry_after=err.retry_after)


def refused_or_unavailable(err: ProviderError, offer_id: str, what: str) -> RentRefused | ProviderUnavailable:
    """A failed rent: a 4xx about the request (not 401/403/429) refuses this offer; anything
    else leaves the outcome unknown or temporary."""
    status = err.status
    if status is not None and 400 <= status < 500 and status != 429 and status not in AUTH_STATUSES:
        return RentRefused(err.provider, offer_id, f"HTTP {status}: {error_text(err.body)}")
    return unavailable(err, what)
