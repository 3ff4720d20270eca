"""``GET /v1/nodes/{id}/logs`` (admin): the node's workload logs, proxied from its agent API.

The coordinator signs a single-use access token for the node (as ``POST
/v1/nodes/{id}/access-token`` does) and calls ``GET http://<mesh address>:<api port>/logs``
with the caller's ``follow``, ``tail``, ``since``, ``stream`` and ``timestamps`` (the agent
checks them; its 400 comes back as it is). The answer is copied chunk by chunk as it arrives
(a ``follow`` stream stays open until the workload ends or the caller goes away); nothing is
buffered beyond one chunk.

Reachability: the coordinator opens a TCP connection to the node's **mesh address**, so it
needs a route to the mesh, e.g. running in the cluster whose networks the gateways serve,
with the mesh network routed to a gateway (docs/gateway.md). A coordinator without one
answers 502 naming the address; the cluster can then call the agent itself with a token from
``POST /v1/nodes/{id}/access-token`` (what :func:`anex_agent.client.rest.node_logs` does).
"""

from __future__ import annotations

import ipaddress
import logging

import aiohttp
from aiohttp import web

from anex_agent.wire import access_token
from anex_agent.coordinator import nodes, problems
from anex_agent.coordinator.routes.registry import QueryParam

log = logging.getLogger(__name__)

PARAMS = ("follow", "tail", "since", "stream", "timestamps")
CONNECT_TIMEOUT = 5.0
QUERY = (
    QueryParam("follow", description="1: stream new lines until the workload ends"),
    QueryParam("tail", "integer", "only the last N lines", maximum=1_000_000),
    QueryParam("since", description="RFC 3339 time with an offset: lines from then on"),
    QueryParam("stream", description="stdout or stderr (default both)"),
    QueryParam("timestamps", description="1: each line starts with its RFC 3339 time"),
)


def agent_url(address: str, port: int) -> str:
    host = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    return f"http://{host}:{port}/logs"


async def proxy(call) -> web.StreamResponse:
    ctx = call.ctx
    node_id = call.param("node_id")
    view = await nodes.view(ctx, node_id)  # 404 for an unknown node
    url = agent_url(view.address, view.facts.api_port)
    token, _ = access_token.sign(ctx.signing_key, node_id, now=ctx.clock(), ttl=ctx.settings.access_token_ttl)
    params = {name: call.request.query[name] for name in PARAMS if name in call.request.query}
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT, connect=CONNECT_TIMEOUT)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.get(url, params=params, headers={"Authorization": f"Bearer {token}"}) as upstream:
                if upstream.status != 200:
                    body = await upstream.content.read(64 * 1024)
                    if upstream.status in (400, 404):
                        return web.Response(status=upstream.status, body=body,
                                            content_type="application/problem+json")
                    raise problems.Problem(502, "Bad Gateway", f"the agent of node {node_id} answered "
                                           f"{upstream.status}", slug="bad-gateway")
                response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8",
                                                       "Cache-Control": "no-store"})
                await response.prepare(call.request)
                try:
                    async for chunk in upstream.content.iter_any():
                        await response.write(chunk)
                except (aiohttp.ClientError, OSError, TimeoutError) as err:  # the agent went away mid-stream
                    log.info("node logs: the stream from node %s ended: %s", node_id, err)
                await response.write_eof()
                return response
    except (aiohttp.ClientError, OSError, TimeoutError) as err:
        log.info("node logs: cannot reach the agent API of node %s at %s: %s", node_id, url, err)
        raise problems.Problem(
            502, "Bad Gateway",
            f"cannot reach the agent API of node {node_id} at {view.address}:{view.facts.api_port}; the coordinator "
            "needs a route to the mesh (through a gateway), else call the agent with a token from "
            f"POST /v1/nodes/{node_id}/access-token", slug="bad-gateway") from None
