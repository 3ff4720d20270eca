"""``GET /containerLogs/{namespace}/{pod}/{container}``: a container's log, as the kubelet serves it.

Query (the kubelet's ``PodLogOptions``): ``follow``, ``tailLines`` (or the older ``tail``,
``all`` = everything), ``sinceSeconds``, ``sinceTime`` (RFC 3339), ``timestamps``,
``limitBytes``, ``previous``, ``stream`` (``All``, ``Stdout``, ``Stderr``). A value that does
not parse: 400 ``Unable to decode query.``; one that parses but is invalid (negative
``tailLines``, ``limitBytes`` < 1, ``sinceSeconds`` < 1, both ``sinceSeconds`` and
``sinceTime``): 422 ``Invalid request.``, as the kubelet answers.

The text comes from the node through the coordinator's ``GET /v1/nodes/{id}/logs`` (the
agent's log ring; ``follow``, ``tail``, ``since``, ``stream``, ``timestamps``) and is written
chunk by chunk as it comes: nothing holds the whole log. ``limitBytes`` cuts the answer
after that many bytes. A followed log holds one of the Node's stream slots
(``Limits.max_streams``; none free: 429). ``previous`` is answered 400 ``previous terminated container "c" in pod
"p" not found`` (the kubelet's answer when there is none): the machine keeps the log of the
current run only.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from aiohttp import web

from anex_agent.errors import AnexError, CoordinatorError
from anex_agent.virtualnode.kubelet.context import CONTEXT_KEY, KubeletContext, TargetError

log = logging.getLogger(__name__)

_INT = re.compile(r"-?[0-9]{1,18}")
_RFC3339 = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?([Zz]|[+-][0-9]{2}:[0-9]{2})")
STREAMS = {"All": None, "Stdout": "stdout", "Stderr": "stderr"}


class BadQuery(AnexError):
    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


@dataclass(frozen=True)
class LogOptions:
    follow: bool = False
    tail_lines: int | None = None
    since_seconds: int | None = None
    since_time: datetime | None = None
    timestamps: bool = False
    limit_bytes: int | None = None
    previous: bool = False
    stream: str | None = None  # stdout, stderr, None: both

    def agent_params(self, now: datetime) -> dict[str, str | int]:
        """The query of the coordinator's (and agent's) logs route."""
        params: dict[str, str | int] = {}
        if self.follow:
            params["follow"] = 1
        if self.tail_lines is not None:
            params["tail"] = self.tail_lines
        since = self.since_time
        if self.since_seconds is not None:
            since = now - timedelta(seconds=self.since_seconds)
        if since is not None:
            params["since"] = since.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        if self.stream:
            params["stream"] = self.stream
        if self.timestamps:
            params["timestamps"] = 1
        return params


def _bool(query, name: str) -> bool:
    value = query.get(name)
    if value is None or value == "":
        return False
    if value.lower() in ("true", "1", "t"):
        return True
    if value.lower() in ("false", "0", "f"):
        return False
    raise BadQuery(400, '{"message": "Unable to decode query."}')


def _int(query, name: str) -> int | None:
    value = query.get(name)
    if value is None:
        return None
    if not _INT.fullmatch(value):
        raise BadQuery(400, '{"message": "Unable to decode query."}')
    return int(value)


def parse_options(query) -> LogOptions:
    """The kubelet's reading of the query (see the module docstring); BadQuery(status, message)."""
    tail = query.get("tail")
    tail_lines = _int(query, "tailLines")
    if tail and tail != "all":
        if not _INT.fullmatch(tail):
            raise BadQuery(400, '{"message": "Unable to decode query."}')
        tail_lines = int(tail)
    elif tail == "all":
        tail_lines = None
    since_time = None
    if query.get("sinceTime"):
        text = query["sinceTime"]
        if not _RFC3339.fullmatch(text):
            raise BadQuery(400, '{"message": "Unable to decode query."}')
        since_time = datetime.fromisoformat(re.sub(r"\.([0-9]{6})[0-9]+", r".\1", text.upper().replace("Z", "+00:00")))
    stream_text = query.get("stream") or "All"
    if stream_text not in STREAMS:
        raise BadQuery(400, f'invalid stream type "{stream_text}"')
    options = LogOptions(follow=_bool(query, "follow"), tail_lines=tail_lines,
                         since_seconds=_int(query, "sinceSeconds"), since_time=since_time,
                         timestamps=_bool(query, "timestamps"), limit_bytes=_int(query, "limitBytes"),
                         previous=_bool(query, "previous"), stream=STREAMS[stream_text])
    invalid = ((options.tail_lines is not None and options.tail_lines < 0)
               or (options.limit_bytes is not None and options.limit_bytes < 1)
               or (options.since_seconds is not None and options.since_seconds < 1)
               or (options.since_seconds is not None and options.since_time is not None))
    if invalid:
        raise BadQuery(422, '{"message": "Invalid request."}')
    return options


async def container_logs(request: web.Request) -> web.StreamResponse:
    context: KubeletContext = request.app[CONTEXT_KEY]
    namespace, pod, container = (request.match_info[k] for k in ("namespace", "pod", "container"))
    try:
        options = parse_options(request.query)
    except BadQuery as err:
        return web.Response(status=err.status, text=str(err), content_type="text/plain")
    try:
        target = await context.pods.find(namespace, pod, container)
    except TargetError as err:
        return web.Response(status=err.status, text=err.message, content_type="text/plain")
    if options.previous:
        return web.Response(status=400, text=f'previous terminated container "{container}" in pod "{pod}" not found',
                            content_type="text/plain")
    if not options.follow:
        return await _stream(request, context, target, options, namespace, pod, container)
    with context.slots.held() as ok:
        if not ok:
            return web.Response(status=429, text=f"too many streams open on this node (at most "
                                f"{context.slots.limit}); try again later", content_type="text/plain")
        return await _stream(request, context, target, options, namespace, pod, container)


async def _stream(request: web.Request, context: KubeletContext, target, options: LogOptions, namespace: str,
                  pod: str, container: str) -> web.StreamResponse:
    chunks = context.coordinator.node_logs(target.node_id, **options.agent_params(datetime.now(timezone.utc)))
    response = web.StreamResponse(headers={"Content-Type": "text/plain", "Cache-Control": "no-cache"})
    response.enable_chunked_encoding()
    left = options.limit_bytes
    try:
        try:
            first = await anext(chunks, b"")
        except CoordinatorError as err:
            status = 404 if err.status == 404 else 502
            return web.Response(status=status, text=f'the log of container "{container}" in pod "{pod}" cannot be '
                                f'read now: {err.problem.get("detail") or err}', content_type="text/plain")
        await response.prepare(request)
        chunk = first
        while chunk:
            if left is not None:
                chunk = chunk[:left]
                left -= len(chunk)
            await response.write(chunk)
            if left == 0:
                break
            try:
                chunk = await anext(chunks, b"")
            except CoordinatorError as err:
                log.info("kubelet port: the log of %s/%s stopped: %s", namespace, pod, err)
                break
    finally:
        await chunks.aclose()
    await response.write_eof()
    return response


def add_routes(app: web.Application, context: KubeletContext) -> None:
    app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", container_logs)
