"""The gateway's calls to the coordinator, over :class:`anex_agent.client.CoordinatorClient`.

    register(GatewayRegisterRequest) -> GatewayRegisterResponse   POST /v1/gateways (gateway join token)
    peers(gateway_id) -> PeerSet                                   GET /v1/gateways/{id}/peers (credential)
    watch(since) -> async iterator of WatchEvent                   GET /v1/watch (credential; the client
                                                                   reconnects by itself and raises only
                                                                   non-retryable errors such as a 401)

Every failure is a :class:`~anex_agent.errors.CoordinatorError` that says whether it is retryable.
"""

from __future__ import annotations

from anex_agent.agent.link import LinkBase
from anex_agent.wire import GatewayRegisterRequest, GatewayRegisterResponse, PeerSet


class GatewayLink(LinkBase):
    async def register(self, request: GatewayRegisterRequest) -> GatewayRegisterResponse:
        return await self.client.register_gateway(
            request.token, request.public_key, request.name,
            endpoint=request.endpoint, ws_url=request.ws_url, routes=list(request.routes),
        )

    async def peers(self, gateway_id: str) -> PeerSet:
        return await self.client.get_peers(gateway_id)
