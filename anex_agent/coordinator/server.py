"""The coordinator's HTTP server runner: aiohttp's, with aiohttp's own error answers as problem+json.

aiohttp answers some requests before any application code runs: a request line or
header that is too long or malformed (400), a raw 0xFF byte in the URL, a NUL in a
header, and a handler that times out (504) or escapes every middleware (500). Those
answers are ``text/plain`` and bypass middlewares and signals. :class:`AppRunner`
makes them RFC 9457 problem documents like every other error of the coordinator.

aiohttp has no public hook for this (its ``RequestHandler.handle_error`` is the one
place that builds the answer), so the runner gives its server a protocol subclass
that overrides that method. Contract kept from aiohttp: the connection is closed after
the answer; nothing is sent when a response was already started (``ConnectionError``).
Client mistakes (4xx) are logged at debug, failures of the coordinator (5xx) with a
traceback; the caller never sees exception text.

Use: ``runner = AppRunner(app, access_log=None)`` wherever ``web.AppRunner`` was used.
"""

from __future__ import annotations

import logging
from http import HTTPStatus

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from anex_agent.coordinator import problems
from anex_agent.net.peer_log import peer_text

log = logging.getLogger(__name__)

_DETAIL = {
    400: "the request line, a header or the URL is malformed or too large",
    413: "the request is too large",
    431: "the request headers are too large",
    500: "the coordinator failed; see its log",
    504: "the coordinator did not answer in time",
}


def problem_for(status: int) -> problems.Problem:
    """The problem document answered for one of aiohttp's own errors with ``status``."""
    try:
        title = HTTPStatus(status).phrase
    except ValueError:
        title = "Error"
    detail = _DETAIL.get(status, "the request could not be handled" if status < 500 else _DETAIL[500])
    slug = "bad-request" if status == 400 else "internal" if status == 500 else None
    return problems.Problem(status, title, detail, slug=slug)


class ProblemRequestHandler(RequestHandler):
    """aiohttp's per-connection protocol, answering its own errors with problem+json."""

    __slots__ = ()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500:
            log.error("error handling a request from %s", request.remote, exc_info=exc)
        else:
            log.debug("refused a malformed request from %s (%s): %s", request.remote, status, peer_text(message or exc))
        if request.writer.output_size > 0:  # as aiohttp: a response was started, only closing is left
            raise ConnectionError("Response is sent already, cannot send another response with the error message")
        response = problem_for(status).response()
        response.force_close()
        return response


class _ProblemServer(web.Server):
    def __call__(self) -> RequestHandler:
        return ProblemRequestHandler(self, loop=self._loop, **self._kwargs)


class AppRunner(web.AppRunner):
    """``web.AppRunner`` whose connections answer aiohttp's own errors as problem+json."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        return _ProblemServer(
            server.request_handler,
            request_factory=server.request_factory,
            handler_cancellation=server.handler_cancellation,
            loop=server._loop,
            **server._kwargs,
        )

