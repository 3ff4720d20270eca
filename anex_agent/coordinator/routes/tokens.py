"""Join tokens (admin): create, list (never the secrets), revoke."""

from __future__ import annotations

from anex_agent.wire.join import JoinTokenCreate, JoinTokenCreated, JoinTokenList
from anex_agent.coordinator import tokens
from anex_agent.coordinator.auth import Auth
from anex_agent.coordinator.routes.registry import Call, Route, RouteRegistry


async def create_join_token(call: Call) -> JoinTokenCreated:
    ctx = call.ctx
    async with ctx.db.transaction() as tx:
        return await tokens.create(tx, call.body, now=ctx.clock())


async def list_join_tokens(call: Call) -> JoinTokenList:
    async with call.ctx.db.transaction() as tx:
        return await tokens.list_views(tx)


async def revoke_join_token(call: Call) -> None:
    async with call.ctx.db.transaction() as tx:
        await tokens.revoke(tx, call.param("token_id"))


def setup(registry: RouteRegistry, ctx) -> None:
    registry.add(Route(
        "POST", "/v1/join-tokens", create_join_token, Auth.admin,
        "Create a join token for nodes or gateways (the secret is shown once)",
        request_model=JoinTokenCreate, response_model=JoinTokenCreated, status=201, tags=("tokens",),
    ))
    registry.add(Route(
        "GET", "/v1/join-tokens", list_join_tokens, Auth.admin, "List join tokens (without their secrets)",
        response_model=JoinTokenList, tags=("tokens",),
    ))
    registry.add(Route(
        "DELETE", "/v1/join-tokens/{token_id}", revoke_join_token, Auth.admin,
        "Revoke a join token (nodes that joined with it stay)", status=204, tags=("tokens",),
    ))
