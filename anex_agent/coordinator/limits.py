"""How much the coordinator lets one caller take: body sizes, read times, connections,
failed authentications.

Contract:
* :class:`Limits` is the configuration (frozen; defaults below, part of
  :class:`~anex_agent.coordinator.settings.Settings`).
* :func:`read_body` reads a request body with a cap and a deadline: a ``Content-Length``
  over the cap is refused before a byte is read, a body that grows over it is refused as
  soon as it does (413 naming the limit); a body that does not arrive within
  ``body_timeout`` is 408. Nothing above the cap is ever buffered.
* :class:`FailedAuths` counts failed authentications per source address in a fixed
  window; a source with ``failed_auth_max`` failures is answered 429 with
  ``Retry-After`` until its window ends. Memory is bounded: at most ``failed_auth_sources``
  sources are remembered (least recently failed forgotten first). The source is the TCP
  peer; behind a reverse proxy that is the proxy, so one flood blocks every caller not yet
  verified, unless the proxy is named in ``trusted_proxies``: then the source is the last
  ``X-Forwarded-For`` address that is not a trusted proxy. A request whose credential is
  already known to this process is never blocked.
* :func:`concurrency_middleware` answers 503 (``Retry-After``, ``Connection: close``) to a
  request arriving while ``max_concurrent`` requests (open watch streams included) are in
  progress.
* :func:`make_runner` is the aiohttp runner with the idle/header timeout: a connection that
  has not delivered a complete request head ``header_timeout`` seconds after it opened, or
  after its previous response, is closed.
"""

from __future__ import annotations

import asyncio
import ipaddress
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from anex_agent.coordinator import problems

KIB = 1024

JOIN_BODY_LIMIT = 16 * KIB  # a join or registration request: a token, a key, a name and the facts
DEFAULT_BODY_LIMIT = 256 * KIB  # admin requests (tunnels, tokens, selection)
HEARTBEAT_BODY_LIMIT = 256 * KIB  # status plus the telemetry block (anex_agent.telemetry.bounds)
MAX_BODY_LIMIT = 1024 * KIB  # aiohttp's own cap (client_max_size) for anything read without a route limit


@dataclass(frozen=True)
class Limits:
    body_timeout: float = 30.0  # seconds for a whole request body to arrive
    header_timeout: float = 15.0  # seconds for a request head (also idle keep-alive time)
    max_concurrent: int = 8192  # requests in progress at once, watch streams included
    failed_auth_max: int = 20  # failed authentications per source ...
    failed_auth_window: float = 60.0  # ... within this many seconds, then 429 until the window ends
    failed_auth_sources: int = 10_000  # sources remembered at most (bounded memory)
    watch_queue: int = 1024  # changes queued for one watch stream before it is sent to resync
    watch_send_timeout: float = 10.0  # seconds one event may take to reach a watcher's socket
    trusted_proxies: frozenset[str] = frozenset()  # peers whose X-Forwarded-For names the source


def too_large(limit: int, route: str) -> problems.Problem:
    return problems.Problem(
        413, "Content Too Large", f"the request body is larger than {limit} bytes, the limit of {route}",
        slug="too-large", limit=limit,
    )


async def read_body(request: web.Request, limit: int, *, timeout: float, route: str) -> bytes:
    """The body of ``request``, at most ``limit`` bytes within ``timeout`` seconds (else 413 / 408)."""
    length = request.content_length
    if length is not None and length > limit:
        raise too_large(limit, route)
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout):
            while True:
                chunk = await request.content.read(min(64 * KIB, limit + 1 - size))
                if not chunk:
                    break
                size += len(chunk)
                if size > limit:
                    raise too_large(limit, route)
                chunks.append(chunk)
    except TimeoutError:
        raise problems.Problem(408, "Request Timeout", f"the request body did not arrive within {timeout:g} seconds",
                               slug="timeout", headers={"Connection": "close"}) from None
    return b"".join(chunks)


def too_many(retry_after: float) -> problems.Problem:
    """The 429 for a source blocked for ``retry_after`` more seconds."""
    seconds = max(1, math.ceil(retry_after))
    return problems.Problem(
        429, "Too Many Requests", f"too many failed authentications from this address; retry in {seconds} seconds",
        slug="too-many-requests", headers={"Retry-After": str(seconds)},
    )


def source_of(request: web.Request, trusted_proxies: frozenset[str] = frozenset()) -> str:
    """The address failed authentications are counted against: the TCP peer, or behind a
    trusted proxy the last ``X-Forwarded-For`` hop that is not itself a trusted proxy."""
    peer = request.remote or "unknown"
    if peer not in trusted_proxies:
        return peer
    hops = [hop.strip() for value in request.headers.getall("X-Forwarded-For", []) for hop in value.split(",")]
    for hop in reversed(hops):
        if hop in trusted_proxies:
            continue
        try:
            return str(ipaddress.ip_address(hop))
        except ValueError:
            return peer  # a hop we cannot read: count against the proxy
    return peer


class FailedAuths:
    """Failed authentications per source in a fixed window; bounded LRU of sources."""

    def __init__(self, limits: Limits, clock: Callable[[], float]) -> None:
        self._max = limits.failed_auth_max
        self._window = limits.failed_auth_window
        self._capacity = limits.failed_auth_sources
        self._clock = clock
        self._sources: OrderedDict[str, tuple[float, int]] = OrderedDict()  # source -> (window start, failures)

    def __len__(self) -> int:
        return len(self._sources)

    def retry_after(self, source: str) -> float:
        """Seconds until ``source`` may try again (0: it may now)."""
        entry = self._sources.get(source)
        if entry is None:
            return 0.0
        started, failures = entry
        left = started + self._window - self._clock()
        if left <= 0:
            del self._sources[source]
            return 0.0
        return left if failures >= self._max else 0.0

    def failed(self, source: str) -> None:
        now = self._clock()
        started, failures = self._sources.pop(source, (now, 0))
        if now - started >= self._window:
            started, failures = now, 0
        self._sources[source] = (started, failures + 1)
        while len(self._sources) > self._capacity:
            self._sources.popitem(last=False)


def concurrency_middleware(limits: Limits):
    """Middleware answering 503 beyond ``limits.max_concurrent`` requests in progress."""
    in_progress = 0

    @web.middleware
    async def middleware(request: web.Request, handler) -> web.StreamResponse:
        nonlocal in_progress
        if in_progress >= limits.max_concurrent:
            return problems.Problem(
                503, "Service Unavailable", "the coordinator is serving as many requests as it allows; retry",
                slug="busy", headers={"Retry-After": "5", "Connection": "close"},
            ).response(instance=request.path)
        in_progress += 1
        try:
            return await handler(request)
        finally:
            in_progress -= 1

    return middleware


def make_runner(app: web.Application, limits: Limits, **kwargs) -> web.AppRunner:
    """The runner to serve ``app`` with: idle connections and slow request heads are closed
    after ``limits.header_timeout`` seconds."""
    from anex_agent.coordinator.server import AppRunner  # aiohttp's own error answers as problem documents

    return AppRunner(app, keepalive_timeout=limits.header_timeout, **kwargs)
