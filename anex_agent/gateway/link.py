"""The gateway's calls to the coordinator: register, read peers, watch.

Reuses the agent's :class:`anex_agent.agent.link.CoordinatorLink` (same error
translation: every failure is a CoordinatorError that knows whether it is retryable;
the credential goes in ``Authorization: Bearer``) and adds the gateway routes of the
REST contract (anex_agent.wire):

    POST /v1/gateways            GatewayRegisterRequest -> GatewayRegisterResponse   (gateway join token)
    GET  /v1/gateways/{id}/peers -> PeerSet                                          (gateway credential)
    GET  /v1/watch?since=N       WebSocket of WatchEvent                              (gateway credential)
"""

from __future__ import annotations

from anex_agent.agent.link import CoordinatorLink
from anex_agent.wire import GatewayRegisterRequest, GatewayRegisterResponse, PeerSet


class GatewayLink(CoordinatorLink):
    async def register(self, request: GatewayRegisterRequest) -> GatewayRegisterResponse:
        return await self._call("POST", "/v1/gateways", GatewayRegisterResponse, request)

    async def peers(self, gateway_id: str) -> PeerSet:
        return await self._call("GET", f"/v1/gateways/{gateway_id}/peers", PeerSet)
