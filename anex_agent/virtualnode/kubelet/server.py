"""The kubelet port of one virtual Node: an aiohttp HTTPS application (docs/kubernetes.md).

Who may connect: anyone who reaches the address may open TLS; every request must then be
authenticated (a client certificate of the cluster's client CA, or a bearer token the API
server vouches for) and authorized (SubjectAccessReview), as :mod:`.auth` says; anonymous
requests are answered 401 before any route runs, unknown paths 404 only after that.

The route table is assembled from concern modules, each with ``add_routes(app, context)``:
:mod:`.logs`, :mod:`.stats`, :mod:`.podlist`, and :mod:`.streams` (exec, attach,
port-forward) when that module is present.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import ssl
from collections.abc import Awaitable, Callable

from aiohttp import web

from anex_agent.errors import PortInUseError
from anex_agent.virtualnode.kubelet import logs, podlist, stats
from anex_agent.virtualnode.kubelet.context import CONTEXT_KEY, USER_KEY, KubeletContext

log = logging.getLogger(__name__)

STREAMS_MODULE = "anex_agent.virtualnode.kubelet.streams"
CONCERNS = (logs, stats, podlist)


@web.middleware
async def _auth(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                ) -> web.StreamResponse:
    context: KubeletContext = request.app[CONTEXT_KEY]
    user = await context.authorizer.authenticate(request)
    await context.authorizer.authorize(user, request.method, request.path)
    request[USER_KEY] = user
    return await handler(request)


def _streams_module():
    try:
        return importlib.import_module(STREAMS_MODULE)
    except ModuleNotFoundError as err:
        if err.name != STREAMS_MODULE:
            raise
        return None


def build_app(context: KubeletContext) -> web.Application:
    """The application of one Node: the auth middleware, then every concern's routes."""
    app = web.Application(middlewares=[_auth], client_max_size=context.limits.max_request_bytes)
    app[CONTEXT_KEY] = context
    for module in CONCERNS:
        module.add_routes(app, context)
    streams = _streams_module()
    if streams is not None:
        streams.add_routes(app, context)
    return app


def tls_context(cert_file: str, key_file: str, client_ca_file: str | None) -> ssl.SSLContext:
    """Server TLS (1.2 and newer) with the serving certificate; with ``client_ca_file``, a client
    certificate is asked for and, when given, must chain to it (else the handshake fails)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    if client_ca_file:
        ctx.load_verify_locations(cafile=client_ca_file)
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


async def serve(context: KubeletContext, host: str, port: int, ssl_context: ssl.SSLContext,
                started: asyncio.Event | None = None) -> None:
    """Serve ``context``'s Node on ``host:port`` until cancelled (PortInUseError when taken)."""
    # handler_cancellation: a client that goes away cancels its handler, so a followed log of a
    # quiet pod stops reading the coordinator and frees its stream slot at once (the API server
    # closes its connection to us when kubectl goes away), not at the pod's next line
    runner = web.AppRunner(build_app(context), access_log=None, handle_signals=False, handler_cancellation=True)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context, backlog=128)
        try:
            await site.start()
        except OSError as err:
            raise PortInUseError("--kubelet-port", [port], f"{host}:{port}: {err.strerror or err}; choose a free port") from None
        log.info("kubelet port of %s: https://%s:%d (client certificates of the cluster CA or API server tokens, "
                 "each request authorized by the API server)", context.node_name, host, port)
        if started is not None:
            started.set()
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
