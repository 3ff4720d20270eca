"""Agent API route ``GET /logs``: the workload's output, from the ring, optionally followed.

Query parameters (each checked; a bad one is a 400 problem document naming it):

* ``follow``: ``0`` (default) or ``1``: keep the answer open and stream new lines until the
  workload ends;
* ``tail``: ASCII digits, at most :data:`MAX_TAIL`: only the last N lines (after ``since``
  and ``stream`` are applied);
* ``since``: an RFC 3339 time with its offset (``2026-01-02T03:04:05Z``): lines from then on;
* ``stream``: ``stdout`` or ``stderr`` (default both);
* ``timestamps``: ``1`` puts each line's RFC 3339 time and a space before it.

The answer is ``text/plain`` written line by line as it is read (never the whole log in
memory at once); a piece of an over-long line is written without its newline, so the text
comes out as the workload wrote it. Authentication is the API's own (its middleware): a
mesh-side caller needs a single-use cluster access token. 404 when the agent runs no
workload (``daemon``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime

from anex_agent import parse
from anex_agent.agent.logs import STREAMS, LogStore
from anex_agent.errors import AnexError
from anex_agent.net.http.server import Request, Response, StreamResponse, problem

MAX_TAIL = 1_000_000
_DIGITS = re.compile(r"[0-9]{1,7}")
_RFC3339 = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?([Zz]|[+-][0-9]{2}:[0-9]{2})")


class BadParameter(AnexError, ValueError):
    def __init__(self, name: str, detail: str) -> None:
        super().__init__(f"{name}: {detail}")
        self.name = name
        self.detail = detail


def parse_query(query) -> dict:
    """The ``LogStore.follow``/``query`` arguments plus ``follow`` and ``timestamps``; BadParameter."""
    out: dict = {}
    for flag in ("follow", "timestamps"):
        value = query.get(flag, "0")
        try:
            out[flag] = parse.boolean(value)
        except ValueError as err:
            raise BadParameter(flag, f"{value[:40]!r} is not accepted; {err}") from None
    tail = query.get("tail")
    if tail is not None:
        if not _DIGITS.fullmatch(tail) or int(tail) > MAX_TAIL:
            raise BadParameter("tail", f"{tail!r} is not accepted; expected ASCII digits, 0 to {MAX_TAIL}")
        tail = int(tail)
    out["tail"] = tail
    since = query.get("since")
    if since is not None:
        if not _RFC3339.fullmatch(since):
            raise BadParameter("since", f"{since!r} is not an RFC 3339 time with an offset, e.g. 2026-01-02T03:04:05Z")
        text = since.upper().replace("Z", "+00:00")
        frac = re.search(r"\.([0-9]+)", text)
        if frac and len(frac.group(1)) > 6:  # datetime keeps microseconds
            text = text.replace(frac.group(0), "." + frac.group(1)[:6])
        try:
            out["since"] = datetime.fromisoformat(text)
        except ValueError:
            raise BadParameter("since", f"{since!r} is not a valid time") from None
    else:
        out["since"] = None
    stream = query.get("stream")
    if stream is not None and stream not in STREAMS:
        raise BadParameter("stream", f"{stream!r} is not accepted; expected stdout or stderr")
    out["stream"] = stream
    return out


def _problem(status: int, title: str, detail: str, **extra) -> Response:
    return problem(status, title, detail, **extra)


def add_routes(app, store: Callable[[], LogStore | None]) -> None:
    """Add ``GET /logs`` to ``app`` (:attr:`AgentApi.app <anex_agent.agent.api.AgentApi.app>`);
    ``store()`` gives the workload's LogStore or None."""

    async def logs(request: Request) -> Response | StreamResponse:
        try:
            args = parse_query(request.query)
        except BadParameter as err:
            return _problem(400, "Bad Request", err.detail, field=err.name)
        current = store()
        if current is None:
            return _problem(404, "Not Found", "this agent runs no workload (anex-agent daemon): there are no logs")
        select = dict(tail=args["tail"], since=args["since"], stream=args["stream"])
        lines = current.follow(**select) if args["follow"] else _iterate(current.query(**select))
        return StreamResponse(_render(lines, args["timestamps"]), headers={"Cache-Control": "no-store"})

    app.router.add_get("/logs", logs)


async def _render(lines, timestamps: bool):
    """The text of ``lines``, one chunk per line as it comes."""
    try:
        async for line in lines:
            if line is None:
                yield b"\n[anex-agent: this reader fell too far behind and was ended]\n"
                break
            prefix = line.time.isoformat(timespec="microseconds").replace("+00:00", "Z").encode() + b" " \
                if timestamps else b""
            yield prefix + line.text + (b"" if line.partial else b"\n")
    finally:
        aclose = getattr(lines, "aclose", None)
        if aclose is not None:
            await aclose()


async def _iterate(lines):
    for line in lines:
        yield line
