"""The gateway's calls to the coordinator, over :class:`anex_agent.client.rest.CoordinatorClient`.

    register(GatewayRegisterRequest, KeyPair) -> GatewayRegisterResponse
                                                                   POST /v1/gateways (gateway join token and
                                                                   a proof of possession of the key pair)
    peers(gateway_id) -> PeerSet                                   GET /v1/gateways/{id}/peers (credential)
    renew(gateway_id) -> CredentialRenewal                         POST /v1/gateways/{id}/credential (rotation)
    gone(gateway_id)                                               POST /v1/gateways/{id}/gone (credential; as
                                                                   it stops: nodes leave it out until it is back)
    watch(since) -> async iterator of WatchEvent                   GET /v1/watch (credential; the client
                                                                   reconnects by itself and raises only
                                                                   non-retryable errors such as a 401)

Every failure is a :class:`~anex_agent.errors.CoordinatorError` that says whether it is retryable.
"""

from __future__ import annotations

from anex_agent.wire import keys
from anex_agent.client.link import LinkBase
from anex_agent.wire.gateways import CredentialRenewal, GatewayRegisterRequest, GatewayRegisterResponse, PeerSet


class GatewayLink(LinkBase):
    async def register(self, request: GatewayRegisterRequest, key: keys.KeyPair) -> GatewayRegisterResponse:
        assert key.public_b64 == request.public_key
        return await self.client.register_gateway(
            request.token, key, request.name,
            endpoint=request.endpoint, ws_url=request.ws_url, routes=list(request.routes),
        )

    async def renew(self, gateway_id: str) -> CredentialRenewal:
        return await self.client.renew_gateway_credential(gateway_id)

    async def peers(self, gateway_id: str) -> PeerSet:
        return await self.client.get_peers(gateway_id)

    async def gone(self, gateway_id: str) -> None:
        await self.client.gateway_gone(gateway_id)
