"""A gateway offering a network the coordinator does not allow stops with a message naming it."""

from __future__ import annotations

import pytest

from anex_agent.errors import CoordinatorError
from anex_agent.gateway.service import Gateway
from anex_agent.gateway.settings import build_settings


async def test_public_route_refused_at_registration_with_a_clear_error(coordinator, tmp_path):
    url, admin = coordinator
    token = (await admin.create_join_token("gateway", reusable=True)).token
    gateway = Gateway(build_settings(coordinator_url=url, token=token, state_dir=str(tmp_path / "gw"),
                                     endpoint="192.0.2.1:51820", routes=["10.96.0.0/12", "0.0.0.0/1", "128.0.0.0/1"]))
    gateway.state.ensure()
    gateway.keypair = gateway.state.keypair()
    try:
        with pytest.raises(CoordinatorError) as info:
            await gateway._initial_registration()
        assert info.value.status == 422 and not info.value.retryable
        assert [e["field"] for e in info.value.problem["errors"]] == ["routes.1", "routes.2"]
        assert "0.0.0.0/1 is outside the networks gateways may offer" in str(info.value), str(info.value)
    finally:
        await gateway.link.close()
    assert (await admin.list_gateways()).gateways == []
