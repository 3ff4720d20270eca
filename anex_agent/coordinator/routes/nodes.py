"""Node routes: join, list/get/delete, heartbeat, config, tunnels, telemetry, access tokens."""

from __future__ import annotations

from anex_agent.wire import access_token
from anex_agent.wire.heartbeat import Heartbeat, HeartbeatAck
from anex_agent.wire.nodes import (
    AgentAccessToken, NodeConfig, NodeJoinRequest, NodeJoinResponse, NodeList, NodeTelemetry, NodeView, TunnelsUpdate,
)
from anex_agent.coordinator import ipam, limits, nodes, problems, tokens
from anex_agent.coordinator.routes import node_actions, node_logs
from anex_agent.coordinator.auth import Auth, Principal
from anex_agent.coordinator.routes.registry import Call, Route, RouteRegistry


def _own_node(call: Call) -> str:
    """The path's node id, when the caller is the admin or that node; else 403."""
    node_id = call.param("node_id")
    principal: Principal = call.principal
    if principal.kind == "node" and principal.id != node_id:
        raise problems.forbidden("a node may only act on itself")
    return node_id


async def join(call: Call) -> NodeJoinResponse:
    try:
        return await nodes.join(call.ctx, call.body)
    except ipam.NetworkExhausted as err:
        raise problems.network_exhausted(str(err)) from None


async def list_nodes(call: Call) -> NodeList:
    return await nodes.list_views(call.ctx)


async def get_node(call: Call) -> NodeView:
    return await nodes.view(call.ctx, call.param("node_id"))


async def delete_node(call: Call) -> None:
    await nodes.delete(call.ctx, call.param("node_id"))


async def heartbeat(call: Call) -> HeartbeatAck:
    node_id = _own_node(call)
    version = await call.ctx.versions.for_node(node_id)
    ack = await nodes.heartbeat(call.ctx, call.principal, call.body, config_version=version)
    if call.ctx.settings.heartbeat_flush_interval == 0:  # write-through: committed before the answer
        await call.ctx.heartbeats.flush()
    return ack


async def get_config(call: Call) -> NodeConfig:
    return await nodes.config(call.ctx, _own_node(call))


async def put_tunnels(call: Call) -> NodeConfig:
    return await nodes.set_tunnels(call.ctx, call.param("node_id"), call.body)


async def get_telemetry(call: Call) -> NodeTelemetry:
    return await nodes.telemetry(call.ctx, _own_node(call))


async def create_access_token(call: Call) -> AgentAccessToken:
    ctx = call.ctx
    node_id = call.param("node_id")
    async with ctx.db.transaction() as tx:
        await nodes.row_of(tx, node_id)
    token, claims = access_token.sign(ctx.signing_key, node_id, now=ctx.clock(), ttl=ctx.settings.access_token_ttl)
    return AgentAccessToken(token=token, expires_at=tokens.to_datetime(claims.expires_at))


def setup(registry: RouteRegistry, ctx) -> None:
    tags = ("nodes",)
    for route in [
        Route("POST", "/v1/nodes", join, Auth.join,
              "Join the mesh with a node join token and a proof of key possession (idempotent per public key)",
              request_model=NodeJoinRequest, response_model=NodeJoinResponse, status=201, tags=tags,
              problems=(409, 503), token_kind="node"),
        Route("GET", "/v1/nodes", list_nodes, Auth.admin, "List nodes", response_model=NodeList, tags=tags),
        Route("GET", "/v1/nodes/{node_id}", get_node, Auth.admin, "Get one node",
              response_model=NodeView, tags=tags),
        Route("DELETE", "/v1/nodes/{node_id}", delete_node, Auth.admin,
              "Delete a node: frees its address (after quarantine) and removes it from every gateway",
              status=204, tags=tags),
        Route("POST", "/v1/nodes/{node_id}/heartbeat", heartbeat, Auth.node,
              "Report status and telemetry (the node itself); the answer may carry a rotated credential",
              request_model=Heartbeat, response_model=HeartbeatAck, tags=tags, problems=(403,),
              body_limit=limits.HEARTBEAT_BODY_LIMIT),
        Route("GET", "/v1/nodes/{node_id}/config", get_config, Auth.node_or_admin,
              "The node's current config (the node itself or the admin)", response_model=NodeConfig, tags=tags,
              problems=(403,)),
        Route("PUT", "/v1/nodes/{node_id}/tunnels", put_tunnels, Auth.admin,
              "Replace the node's tunnels; pushed to the node's watch stream",
              request_model=TunnelsUpdate, response_model=NodeConfig, tags=tags),
        Route("GET", "/v1/nodes/{node_id}/telemetry", get_telemetry, Auth.node_or_admin,
              "The latest telemetry the node reported (the node itself or the admin)",
              response_model=NodeTelemetry, tags=tags, problems=(403,)),
        Route("GET", "/v1/nodes/{node_id}/logs", node_logs.proxy, Auth.admin,
              "The node's workload logs, streamed from its agent API (needs a route from the coordinator to the mesh)",
              tags=tags, content_type="text/plain", problems=(502,), query=node_logs.QUERY),
        Route("POST", "/v1/nodes/{node_id}/signal", node_actions.send_signal, Auth.admin,
              "Send a signal to the node's workload (forwarded to its agent API)",
              tags=tags, status=202, problems=(404, 409, 502), query=node_actions.SIGNAL_QUERY),
        Route("POST", "/v1/nodes/{node_id}/restart", node_actions.restart, Auth.admin,
              "Restart the node's workload (SIGTERM, grace period, started again)",
              tags=tags, status=202, problems=(404, 409, 502)),
        Route("PUT", "/v1/nodes/{node_id}/files", node_actions.push_file, Auth.admin,
              "Push a file into one of the node's ANEX_PUSH_DIRS (the body; written atomically with its mode)",
              tags=tags, status=201, problems=(404, 409, 413, 502), query=node_actions.FILES_QUERY),
        Route("POST", "/v1/nodes/{node_id}/access-token", create_access_token, Auth.admin,
              "A short-lived signed token for the node's agent API (verify with NodeConfig.agent_api_verify_key)",
              response_model=AgentAccessToken, status=201, tags=tags),
    ]:
        registry.add(route)
