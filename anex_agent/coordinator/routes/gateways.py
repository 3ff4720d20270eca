"""Gateway routes: register, list, mark gone, delete, peers, credential."""

from __future__ import annotations

from anex_agent.wire.gateways import (
    CredentialRenewal, GatewayList, GatewayRegisterRequest, GatewayRegisterResponse, GatewayView, PeerSet,
)
from anex_agent.coordinator import gateways, ipam, problems
from anex_agent.coordinator.auth import Auth
from anex_agent.coordinator.routes.registry import Call, Route, RouteRegistry


async def register(call: Call) -> GatewayRegisterResponse:
    try:
        return await gateways.register(call.ctx, call.body)
    except ipam.NetworkExhausted as err:
        raise problems.network_exhausted(str(err)) from None


async def list_gateways(call: Call) -> GatewayList:
    return await gateways.list_views(call.ctx)


async def peers(call: Call) -> PeerSet:
    gateway_id = call.param("gateway_id")
    if call.principal.id != gateway_id:
        raise problems.forbidden("a gateway may only read its own peer set")
    return await gateways.peers(call.ctx, gateway_id)


async def renew_credential(call: Call) -> CredentialRenewal:
    if call.principal.id != call.param("gateway_id"):
        raise problems.forbidden("a gateway may only renew its own credential")
    return await gateways.renew(call.ctx, call.principal)


async def mark_gone(call: Call) -> GatewayView:
    """The gateway as it stops (its own credential), or the admin: nodes leave it out until it is back."""
    gateway_id = call.param("gateway_id")
    if call.principal.kind == "gateway" and call.principal.id != gateway_id:
        raise problems.forbidden("a gateway may only mark itself gone")
    await gateways.mark_gone(call.ctx, gateway_id, "stopped" if call.principal.kind == "gateway" else "marked gone by the admin")
    return await gateways.view(call.ctx, gateway_id)


async def delete_gateway(call: Call) -> None:
    await gateways.delete(call.ctx, call.param("gateway_id"))


def setup(registry: RouteRegistry, ctx) -> None:
    tags = ("gateways",)
    registry.add(Route("POST", "/v1/gateways", register, Auth.join,
                       "Register a gateway with a gateway join token and a proof of key possession (idempotent per public key)",
                       request_model=GatewayRegisterRequest, response_model=GatewayRegisterResponse,
                       status=201, tags=tags, problems=(409, 503), token_kind="gateway"))
    registry.add(Route("GET", "/v1/gateways", list_gateways, Auth.admin, "List gateways",
                       response_model=GatewayList, tags=tags))
    registry.add(Route("DELETE", "/v1/gateways/{gateway_id}", delete_gateway, Auth.admin,
                       "Delete a gateway (frees its address; nodes get a new gateway set)", status=204, tags=tags))
    registry.add(Route("POST", "/v1/gateways/{gateway_id}/gone", mark_gone, Auth.gateway_or_admin,
                       "Mark the gateway gone (it stops): nodes leave it out of their configs until it is back "
                       "(it opens its watch stream, reads its peers or registers again); the gateway itself or the admin",
                       response_model=GatewayView, tags=tags, problems=(403, 404)))
    registry.add(Route("GET", "/v1/gateways/{gateway_id}/peers", peers, Auth.gateway,
                       "The full peer set the gateway must serve (the gateway itself)",
                       response_model=PeerSet, tags=tags, problems=(403,)))
    registry.add(Route("POST", "/v1/gateways/{gateway_id}/credential", renew_credential, Auth.gateway,
                       "Rotate the gateway's credential (the old one keeps working for a short grace)",
                       response_model=CredentialRenewal, tags=tags, problems=(403,)))
