"""The HTTP client shared by the provider sources.

* retries on 429 and 5xx responses and on connection errors/timeouts, after a
  :class:`anex_agent.backoff.Backoff` delay (base ``backoff`` seconds, doubling, capped at
  ``max_backoff``, its jitter);
  a ``Retry-After`` header (RFC 9110 §10.2.3: delay-seconds or an HTTP-date) is honoured,
  capped at ``max_retry_after``;
* a per-attempt timeout (``timeout`` seconds for the whole request);
* a short TTL cache of successful answers keyed by method, URL, query and body, so a
  burst of pods asking for the same offers makes one provider call (concurrent identical
  calls share one in-flight request); the answer is decoded, and turned into what the
  caller's ``build`` makes of it (an offer table), on the selection thread
  (:mod:`anex_agent.selection.threads`), and that result is what is cached;
* one short-lived ``aiohttp.ClientSession`` per fetch (a fetch happens at most once per TTL
  per query), so nothing stays open between selections and nothing needs closing at
  shutdown;
* credentials go in headers given by the caller and are never logged; log lines carry
  the method, the URL without its query, the status and the attempt number only.

Errors leave as :class:`ProviderError` with ``retryable`` and ``status``.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import aiohttp

from anex_agent.backoff import Backoff
from anex_agent.errors import AnexError
from anex_agent.selection import threads
from anex_agent.selection.jsonpieces import dismantle, loads_in_pieces

if TYPE_CHECKING:
    import random

log = logging.getLogger(__name__)

ERROR_BODY_LIMIT = 2048  # bytes of a refusing answer kept on the ProviderError


class ProviderError(AnexError):
    """A provider API call failed. ``retryable``: a later call may succeed.

    ``retry_after``: seconds the provider asked to wait (its last ``Retry-After``), if any;
    ``body``: the start of a refusing (4xx) or failing (429, 5xx) answer's body, for callers that classify the
    provider's own error code (it never holds the request's credentials)."""

    def __init__(self, provider: str, message: str, *, status: int | None = None, retryable: bool = False,
                 retry_after: float | None = None, body: str = "") -> None:
        self.provider = provider
        self.status = status
        self.retryable = retryable
        self.retry_after = retry_after
        self.body = body
        super().__init__(f"{provider}: {message}")


@dataclass(frozen=True)
class HttpPolicy:
    """Retry/timeout/cache settings (seconds). Defaults suit an interactive selection."""

    timeout: float = 15.0
    attempts: int = 4
    backoff: float = 0.5
    max_backoff: float = 8.0
    max_retry_after: float = 30.0
    cache_ttl: float = 30.0


def retry_after_seconds(value: str | None, now: float) -> float | None:
    """Parse a Retry-After header: delay-seconds or an HTTP-date (RFC 9110 §10.2.3)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - now)


class JsonClient:
    """Retrying, caching JSON-over-HTTP client for one provider. Use ``async with`` or ``close()``."""

    def __init__(
        self,
        provider: str,
        *,
        policy: HttpPolicy = HttpPolicy(),
        sleep: Callable[[float], Any] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.provider = provider
        self.policy = policy
        self._sleep = sleep
        self._clock = clock
        self._backoff = Backoff(base=policy.backoff, cap=policy.max_backoff, rng=rng)
        self._cache: dict[str, tuple[float, Any]] = {}
        self._inflight: dict[str, asyncio.Future] = {}
        self.calls = 0  # HTTP attempts made (for tests and metrics)

    async def __aenter__(self) -> "JsonClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Drop the cached answers (freed on the worker thread); sessions live for one fetch."""
        values = [value for _stored, value in self._cache.values()]
        self._cache.clear()
        if values:
            threads.release(values)

    async def request(self, method: str, url: str, *, params: dict | None = None, body: Any = None,
                      headers: dict[str, str] | None = None, build: Callable[[Any], Any] | None = None) -> Any:
        """The decoded JSON answer, or ``build(answer)`` when ``build`` is given, from the cache when
        a fresh one is there.

        Decoding (in pieces, :mod:`~anex_agent.selection.jsonpieces`) and ``build`` run on the
        selection worker thread, never on the event loop; what is cached is their result (for
        a provider source: its offer table), so a table is built once per fetch. ``build`` may
        raise :class:`ProviderError` (not cached, not retried). Callers of one client use one
        ``build`` per request.
        """
        key = json.dumps([method, url, params, body], sort_keys=True, default=str)
        self._evict_expired()
        hit = self._cache.get(key)
        if hit is not None and self._clock() - hit[0] < self.policy.cache_ttl:
            return hit[1]
        pending = self._inflight.get(key)
        if pending is not None:
            try:
                return await asyncio.shield(pending)
            except asyncio.CancelledError:
                if not pending.cancelled():
                    raise  # we were cancelled ourselves
                return await self.request(method, url, params=params, body=body, headers=headers, build=build)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            value = await self._fetch(method, url, params, body, headers or {}, build)
        except asyncio.CancelledError:
            future.cancel()  # waiters make the call themselves
            raise
        except BaseException as err:
            future.set_exception(err)
            future.exception()  # mark retrieved: nobody else may be waiting
            raise
        else:
            self._cache[key] = (self._clock(), value)
            future.set_result(value)
            return value
        finally:
            del self._inflight[key]

    def _evict_expired(self) -> None:
        """Drop expired answers (every distinct query has its own entry); their tables are freed
        on the worker thread, not here on the loop."""
        now = self._clock()
        expired = [key for key, (stored, _value) in self._cache.items() if now - stored >= self.policy.cache_ttl]
        if expired:
            threads.release([self._cache.pop(key)[1] for key in expired])

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.policy.max_retry_after)
        return self._backoff.delay(attempt)

    async def _fetch(self, method: str, url: str, params: dict | None, body: Any, headers: dict[str, str],
                     build: Callable[[Any], Any] | None) -> Any:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.policy.timeout)) as session:
            raw = await self._attempts(session, method, url, params, body, headers)
        return await threads.run(self._decode, raw, f"{method} {url}", build)

    def _decode(self, raw: list[bytes], what: str, build: Callable[[Any], Any] | None) -> Any:
        """On the worker thread: the JSON answer, and what ``build`` makes of it."""
        if not any(raw):  # an empty answer (204, or a DELETE that says nothing): None
            answer = None
            return answer if build is None else build(answer)
        try:
            answer = loads_in_pieces(raw)
        except ValueError:
            raise ProviderError(self.provider, f"{what} answered with something that is not JSON") from None
        if build is None:
            return answer
        try:
            return build(answer)
        finally:
            dismantle(answer)  # freed here, in pieces: not in one long call

    async def _attempts(self, session: aiohttp.ClientSession, method: str, url: str, params: dict | None, body: Any,
                        headers: dict[str, str]) -> list[bytes]:
        """The body of the first successful answer, in the parts received (decoded off the loop)."""
        last: ProviderError | None = None
        for attempt in range(self.policy.attempts):
            self.calls += 1
            retry_after: float | None = None
            try:
                async with session.request(method, url, params=params, json=body, headers=headers) as resp:
                    log.debug("%s %s %s -> %s (attempt %d)", self.provider, method, url, resp.status, attempt + 1)
                    if resp.status == 429 or resp.status >= 500:
                        retry_after = retry_after_seconds(resp.headers.get("Retry-After"), time.time())
                        text = (await resp.content.read(ERROR_BODY_LIMIT)).decode("utf-8", "replace")
                        last = ProviderError(self.provider, f"HTTP {resp.status} from {method} {url}",
                                             status=resp.status, retryable=True, retry_after=retry_after, body=text)
                    elif resp.status >= 400:
                        body = (await resp.content.read(ERROR_BODY_LIMIT)).decode("utf-8", "replace")
                        raise ProviderError(self.provider, f"HTTP {resp.status} from {method} {url}: the request was "
                                            "refused (check the API key and the query)", status=resp.status, body=body)
                    else:  # the parts as received: never joined into one buffer on the loop
                        return [part async for part in resp.content.iter_any()]
            except asyncio.TimeoutError:
                last = ProviderError(self.provider, f"{method} {url} timed out after {self.policy.timeout:g} s",
                                     retryable=True)
            except aiohttp.ClientError as err:
                last = ProviderError(self.provider, f"{method} {url} failed: {type(err).__name__}", retryable=True)
            if attempt + 1 < self.policy.attempts:
                await self._sleep(self._delay(attempt, retry_after))
        assert last is not None
        raise last
