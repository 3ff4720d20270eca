"""The agent API (HTTP/1.1 over :mod:`anex_agent.net.http.server`): ``/healthz``, ``/readyz``, ``/status``, ``/metrics``.

Who may connect:

* on loopback (``ANEX_API_LISTEN``, default ``127.0.0.1:9555``): anyone on this machine,
  no token (the workload and the operator's shell);
* on the node's mesh address (same port): only callers presenting
  ``Authorization: Bearer <token>`` where the token was signed by the coordinator for the
  cluster (checked with the ``agent_api_verify_key`` of the node config). A request whose
  *peer* address is not loopback always needs the token, whatever socket it arrived on.
  A token is good for one request (:class:`anex_agent.wire.access_token.ReplayCache`): the
  caller fetches a new one for each call.

Answers on the mesh side: no bearer token, or a token used before: 401; a token that is
invalid, expired, lives longer than an hour or is for another node: 403; more live tokens
than the agent remembers (:data:`anex_agent.wire.access_token.MAX_REMEMBERED`): 429 with
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

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from anex_agent.wire.access_token import Claims, ReplayCache, ReplayCacheFull, TokenReplayed
from anex_agent.net.http.server import HttpServer, Request, Response, StreamResponse, json_response, text_response
from anex_agent.net.http.server import problem as _problem_doc

log = logging.getLogger(__name__)

StatusFn = Callable[[], Awaitable[dict[str, Any]]]
ReadyFn = Callable[[], Awaitable[tuple[bool, str]]]
#: ``verify(token, now)``: the claims of a valid cluster access token for this node at
#: ``now``, or None (the verifier logs why).
VerifyFn = Callable[[str, float], Claims | None]
RouteHandler = Callable[[Request], Awaitable["Response | StreamResponse"]]


def is_loopback_peer(request: Request) -> bool:
    peer = request.peername
    if not peer:
        return False
    try:
        addr = ipaddress.ip_address(peer[0].split("%")[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _problem(status: int, title: str, detail: str, headers: dict[str, str] | None = None) -> Response:
    if status == 401:
        headers = {"WWW-Authenticate": 'Bearer realm="anex-agent"', **(headers or {})}
    return _problem_doc(status, title, detail, headers)


class Routes:
    """The API's routes: ``(method, path) -> handler``; ``add_get`` also answers HEAD."""

    def __init__(self) -> None:
        self.table: dict[str, dict[str, RouteHandler]] = {}

    @property
    def router(self) -> Routes:  # ``api.app.router.add_get(...)`` reads as it did
        return self

    def add_route(self, method: str, path: str, handler: RouteHandler) -> None:
        self.table.setdefault(path, {})[method] = handler

    def add_get(self, path: str, handler: RouteHandler) -> None:
        self.add_route("GET", path, handler)
        self.add_route("HEAD", path, handler)

    def add_post(self, path: str, handler: RouteHandler) -> None:
        self.add_route("POST", path, handler)

    def add_put(self, path: str, handler: RouteHandler) -> None:
        self.add_route("PUT", path, handler)

    async def dispatch(self, request: Request) -> Response | StreamResponse:
        methods = self.table.get(request.path)
        if methods is None:
            return _problem(404, "Not Found", f"no route {request.path}")
        handler = methods.get(request.method)
        if handler is None:
            return _problem(405, "Method Not Allowed", f"{request.path} does not take {request.method}",
                            headers={"Allow": ", ".join(sorted(methods))})
        return await handler(request)


class AgentApi:
    """Holds the routes and serves them (loopback, and mesh once known).

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
        is_local: Callable[[Request], bool] = is_loopback_peer,
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
        self.app = Routes()
        self.app.add_get("/healthz", self.healthz)
        self.app.add_get("/readyz", self.readyz)
        self.app.add_get("/status", self.status)
        self.app.add_get("/metrics", self.metrics)
        self.server = HttpServer(self._auth, name="agent-api")

    async def _auth(self, request: Request) -> Response | StreamResponse:
        handler = self.app.dispatch
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

    async def healthz(self, request: Request) -> Response:
        return text_response("ok\n")

    async def readyz(self, request: Request) -> Response:
        ready, reason = await self._ready()
        return text_response(f"{'ready' if ready else 'not ready'}: {reason}\n", 200 if ready else 503)

    async def status(self, request: Request) -> Response:
        return json_response(await self._status(), dumps=lambda o: json.dumps(o, indent=2, default=str))

    async def metrics(self, request: Request) -> Response:
        return Response(body=generate_latest(self.registry), content_type=CONTENT_TYPE_LATEST)

    # ---------------------------------------------------------------- serving

    async def start(self, host: str, port: int) -> None:
        """Start serving on ``host:port`` (may be called again for another address)."""
        if self.server.listening(host, port):
            return
        await self.server.listen(host, port)
        log.info("agent API listening on %s:%d%s", host, port, "" if ipaddress.ip_address(host).is_loopback else " (bearer token required)")

    async def protocol_factory(self):
        """The server's asyncio protocol factory, for an engine that serves the mesh side itself
        (its transport's ``peername`` is the mesh caller: the token is required)."""
        return self.server.protocol_factory()

    async def stop_site(self, host: str, port: int) -> None:
        await self.server.stop_listening(host, port)

    async def close(self) -> None:
        await self.server.close()
