"""POST /v1/join-tokens (admin)."""

from __future__ import annotations

from anex_agent import wire
from anex_agent.coordinator import tokens
from anex_agent.coordinator.auth import Auth
from anex_agent.coordinator.registry import Call, Route, RouteRegistry


async def create_join_token(call: Call) -> wire.JoinTokenCreated:
    ctx = call.ctx
    async with ctx.db.transaction() as tx:
        return await tokens.create(tx, call.body, now=ctx.clock())


def setup(registry: RouteRegistry, ctx) -> None:
    registry.add(Route(
        "POST", "/v1/join-tokens", create_join_token, Auth.admin,
        "Create a join token for nodes or gateways (the secret is shown once)",
        request_model=wire.JoinTokenCreate, response_model=wire.JoinTokenCreated, status=201, tags=("tokens",),
    ))
