"""The agent API (aiohttp): ``/healthz``, ``/readyz``, ``/status``, ``/metrics``.

Who may connect:

* on loopback (``ANEX_API_LISTEN``, default ``127.0.0.1:9555``): anyone on this machine,
  no token (the workload and the operator's shell);
* on the node's mesh address (same port): only callers presenting
  ``Authorization: Bearer <token>`` where the token was signed by the coordinator for the
  cluster (checked with the ``agent_api_verify_key`` of the node config). A request whose
  *peer* address is not loopback always needs the token, whatever socket it arrived on.

Routes:
    GET /healthz  200 "ok" while the process serves requests (liveness)
    GET /readyz   200 when the tunnel is up (a recent handshake), else 503 with the reason
    GET /status   JSON document of the agent (engine, path, detect, peers, tunnels, ...)
    GET /metrics  Prometheus text exposition of :attr:`AgentApi.registry`

The API knows nothing about engines: it calls the three functions it is given.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = logging.getLogger(__name__)

StatusFn = Callable[[], Awaitable[dict[str, Any]]]
ReadyFn = Callable[[], Awaitable[tuple[bool, str]]]
#: Returns True when ``token`` is a valid cluster access token for this node.
VerifyFn = Callable[[str], bool]


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


def _problem(status: int, title: str, detail: str) -> web.Response:
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail}
    headers = {"WWW-Authenticate": 'Bearer realm="anex-agent"'} if status == 401 else None
    return web.json_response(body, status=status, content_type="application/problem+json", headers=headers)


class AgentApi:
    """Builds the aiohttp application and runs its sites (loopback, and mesh once known)."""

    def __init__(
        self,
        status: StatusFn,
        ready: ReadyFn,
        verify: VerifyFn,
        registry: CollectorRegistry | None = None,
        *,
        is_local: Callable[[web.Request], bool] = is_loopback_peer,
    ) -> None:
        self._status = status
        self._is_local = is_local
        self._ready = ready
        self._verify = verify
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
        if self._is_local(request):
            return await handler(request)
        token = bearer_token(request)
        if token is None:
            return _problem(401, "Unauthorized", "mesh-side calls need Authorization: Bearer <cluster access token>")
        try:
            ok = self._verify(token)
        except Exception:  # a verifier bug must not open the API
            log.exception("access token verification failed")
            ok = False
        if not ok:
            return _problem(403, "Forbidden", "the access token is invalid, expired or not for this node")
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
