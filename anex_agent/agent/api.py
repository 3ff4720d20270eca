"""The agent API (aiohttp): ``/healthz``, ``/readyz``, ``/status``, ``/metrics``.

Who may connect:

* on loopback (``ANEX_API_LISTEN``, default ``127.0.0.1:9555``): anyone on this machine,
  no token (the workload and the operator's shell);
* on the node's mesh address (same port): only callers presenting
  ``Authorization: Bearer <token>`` where the token was signed by the coordinator for the
  cluster (checked with the ``agent_api_verify_key`` of the node config). A request whose
  *peer* address is not loopback always needs the token, whatever socket it arrived on.
  A token is good for one request (:class:`anex_agent.access_token.ReplayCache`): the
  caller fetches a new one for each call.

Answers on the mesh side: no bearer token, or a token used before: 401; a token that is
invalid, expired, lives longer than an hour or is for another node: 403; more live tokens
than the agent remembers (:data:`anex_agent.access_token.MAX_REMEMBERED`): 429 with
``Retry-After``. Bodies are RFC 9457 problem documents; they never carry the reason a
token was refused (the log does).

Routes:
    GET /healthz  200 "ok" while the process serves requests (liveness)
    GET /readyz   200 when the tunnel is up (a recent handshake), else 503 with the reason
    GET /status   JSON document of the agent (engine, path, detect, peers, tunnels, ...)
    GET /metrics  Prometheus text exposition of :attr:`AgentApi.registry`
    GET /logs     the workload's output, added by :mod:`anex_agent.agent.logs_api`
    POST /signal, POST /restart, PUT /files: the cluster's actions (:mod:`anex_agent.agent.actions`);
                  a token is needed for them on loopback too (:attr:`AgentApi.always_authenticated`)

The API knows nothing about engines: it calls the three functions it is given.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from anex_agent.access_token import Claims, ReplayCache, ReplayCacheFull, TokenReplayed

log = logging.getLogger(__name__)

StatusFn = Callable[[], Awaitable[dict[str, Any]]]
ReadyFn = Callable[[], Awaitable[tuple[bool, str]]]
#: ``verify(token, now)``: the claims of a valid cluster access token for this node at
#: ``now``, or None (the verifier logs why).
VerifyFn = Callable[[str, float], Claims | None]


def is_loopback_peer(request: web.Request) -> bool:
    peer = request.transport.get_extra_info("peername") if request.transport else None
    if not peer:
        return False
    try:
        addr = ipaddress.ip_address(peer[0].split("%")[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def bearer_token(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _problem(status: int, title: str, detail: str, headers: dict[str, str] | None = None) -> web.Response:
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail}
    if status == 401:
        headers = {"WWW-Authenticate": 'Bearer realm="anex-agent"', **(headers or {})}
    return web.json_response(body, status=status, content_type="application/problem+json", headers=headers)


class AgentApi:
    """Builds the aiohttp application and runs its sites (loopback, and mesh once known).

    ``clock`` (seconds since the epoch) judges token lifetimes and replays; ``replay``
    remembers the tokens already used (a default :class:`ReplayCache` when None).
    """

    def __init__(
        self,
        status: StatusFn,
        ready: ReadyFn,
        verify: VerifyFn,
        registry: CollectorRegistry | None = None,
        *,
        is_local: Callable[[web.Request], bool] = is_loopback_peer,
        clock: Callable[[], float] = time.time,
        replay: ReplayCache | None = None,
    ) -> None:
        self._status = status
        self._is_local = is_local
        self._ready = ready
        self._verify = verify
        self._clock = clock
        self._replay = replay if replay is not None else ReplayCache()
        self._full_logged = False
        #: paths that need a token on loopback too (the cluster's actions: :mod:`.actions`)
        self.always_authenticated: set[str] = set()
        #: Other parts (GPU telemetry) register their collectors here.
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.app = web.Application(middlewares=[self._auth])
        self.app.router.add_get("/healthz", self.healthz)
        self.app.router.add_get("/readyz", self.readyz)
        self.app.router.add_get("/status", self.status)
        self.app.router.add_get("/metrics", self.metrics)
        self._runner: web.AppRunner | None = None
        self._sites: dict[tuple[str, int], web.TCPSite] = {}

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        if self._is_local(request) and request.path not in self.always_authenticated:
            return await handler(request)
        token = bearer_token(request)
        if token is None:
            return _problem(401, "Unauthorized", "mesh-side calls need Authorization: Bearer <cluster access token>")
        now = self._clock()
        try:
            claims = self._verify(token, now)
        except Exception:  # a verifier bug must not open the API
            log.exception("access token verification failed")
            claims = None
        if claims is None:
            return _problem(403, "Forbidden", "the access token is invalid, expired or not for this node")
        try:
            self._replay.use(claims, now=now)
        except TokenReplayed:
            log.info("agent API: refused a replayed access token (jti %s)", claims.token_id)
            return _problem(401, "Unauthorized", "this access token was used already; fetch a new one for each call")
        except ReplayCacheFull as err:
            if not self._full_logged:
                log.warning("agent API: %d access tokens still alive are remembered; refusing new ones for %d s",
                            len(self._replay), err.retry_after)
                self._full_logged = True
            return _problem(429, "Too Many Requests",
                            "too many access tokens alive at once; retry after Retry-After seconds (this token was not used)",
                            headers={"Retry-After": str(err.retry_after)})
        self._full_logged = False
        return await handler(request)

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(self, request: web.Request) -> web.Response:
        ready, reason = await self._ready()
        return web.Response(status=200 if ready else 503, text=f"{'ready' if ready else 'not ready'}: {reason}\n")

    async def status(self, request: web.Request) -> web.Response:
        return web.json_response(await self._status(), dumps=lambda o: json.dumps(o, indent=2, default=str))

    async def metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    # ---------------------------------------------------------------- serving

    async def start(self, host: str, port: int) -> None:
        """Start serving on ``host:port`` (may be called again for another address)."""
        if self._runner is None:
            self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
            await self._runner.setup()
        if (host, port) in self._sites:
            return
        site = web.TCPSite(self._runner, host, port, reuse_address=True)
        await site.start()
        self._sites[(host, port)] = site
        log.info("agent API listening on %s:%d%s", host, port, "" if ipaddress.ip_address(host).is_loopback else " (bearer token required)")

    async def protocol_factory(self):
        """The server's asyncio protocol factory, for an engine that serves the mesh side itself
        (its transport's ``peername`` is the mesh caller: the token is required)."""
        if self._runner is None:
            self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
            await self._runner.setup()
        return self._runner.server

    async def stop_site(self, host: str, port: int) -> None:
        site = self._sites.pop((host, port), None)
        if site is not None:
            await site.stop()

    async def close(self) -> None:
        for key in list(self._sites):
            await self.stop_site(*key)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
