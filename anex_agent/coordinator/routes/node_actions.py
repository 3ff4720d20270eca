"""The cluster's actions on a node's workload, through the coordinator (admin):
``POST /v1/nodes/{id}/signal?name=TERM``, ``POST /v1/nodes/{id}/restart`` and
``PUT /v1/nodes/{id}/files?path=...&mode=...`` (the file as the body, 16 MiB at most).

Each is forwarded to the node's agent API (docs/agent.md, "Actions of the cluster") with a
single-use access token the coordinator signs; the agent's answer (status and problem
document) comes back unchanged. A file is streamed through, never held whole here. The
coordinator needs a route to the mesh, as for the logs (:mod:`.node_logs`): 502 otherwise.
"""

from __future__ import annotations

import logging

import aiohttp
from aiohttp import web

from anex_agent.wire import access_token
from anex_agent.coordinator import nodes, problems
from anex_agent.coordinator.routes import node_logs
from anex_agent.coordinator.routes.registry import QueryParam

log = logging.getLogger(__name__)

MAX_FILE = 16 << 20
TIMEOUT = aiohttp.ClientTimeout(total=120, sock_connect=node_logs.CONNECT_TIMEOUT)
SIGNAL_QUERY = (QueryParam("name", description="TERM, INT, HUP, QUIT, USR1, USR2, WINCH or KILL", required=True),)
FILES_QUERY = (
    QueryParam("path", description="absolute path inside one of the node's ANEX_PUSH_DIRS", required=True),
    QueryParam("mode", description="octal file mode, default 0644"),
)


async def _forward(call, method: str, agent_path: str, params: tuple[str, ...], body=None) -> web.Response:
    ctx = call.ctx
    node_id = call.param("node_id")
    view = await nodes.view(ctx, node_id)
    url = node_logs.agent_url(view.address, view.facts.api_port).removesuffix("/logs") + agent_path
    token, _ = access_token.sign(ctx.signing_key, node_id, now=ctx.clock(), ttl=ctx.settings.access_token_ttl)
    query = {name: call.request.query[name] for name in params if name in call.request.query}
    try:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            async with session.request(method, url, params=query, data=body,
                                       headers={"Authorization": f"Bearer {token}"}) as upstream:
                raw = await upstream.content.read(64 * 1024)
                return web.Response(status=upstream.status, body=raw,
                                    content_type=upstream.content_type or "application/json")
    except (aiohttp.ClientError, OSError, TimeoutError) as err:
        log.info("node action %s %s: cannot reach node %s at %s: %s", method, agent_path, node_id, url, err)
        raise problems.Problem(
            502, "Bad Gateway",
            f"cannot reach the agent API of node {node_id} at {view.address}:{view.facts.api_port}; the coordinator "
            "needs a route to the mesh (through a gateway)", slug="bad-gateway") from None


async def send_signal(call) -> web.Response:
    return await _forward(call, "POST", "/signal", ("name",))


async def restart(call) -> web.Response:
    return await _forward(call, "POST", "/restart", ())


async def push_file(call) -> web.Response:
    length = call.request.content_length
    if length is not None and length > MAX_FILE:
        raise problems.Problem(413, "Content Too Large", f"the file is larger than {MAX_FILE} bytes", slug="too-large")

    async def body():
        size = 0
        async for chunk in call.request.content.iter_chunked(65536):
            size += len(chunk)
            if size > MAX_FILE:
                raise problems.Problem(413, "Content Too Large", f"the file is larger than {MAX_FILE} bytes",
                                       slug="too-large")
            yield chunk

    return await _forward(call, "PUT", "/files", ("path", "mode"), body=body())
