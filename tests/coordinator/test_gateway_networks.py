"""The admin's limit on the networks gateways offer: registration refuses the rest, nodes get the list."""

from __future__ import annotations

import argparse

import pytest

from anex_agent.client.rest import CoordinatorError
from anex_agent.coordinator import cli, gateway_networks as gateway_routes
from anex_agent.errors import ConfigError
from anex_agent.wire.route_policy import DEFAULT_GATEWAY_ROUTES
from tests.coordinator.conftest import start_harness, stop_harness


async def test_default_list_refuses_public_networks_422_naming_each_route(coord):
    with pytest.raises(CoordinatorError) as err:
        await coord.gateway("gw", endpoint="203.0.113.9:51820",
                            routes=["10.96.0.0/12", "0.0.0.0/1", "128.0.0.0/1", "10.244.0.0/16", "8.8.8.0/24"])
    assert err.value.status == 422
    errors = err.value.problem["errors"]
    assert [e["field"] for e in errors] == ["routes.1", "routes.2", "routes.4"]
    assert "0.0.0.0/1 is outside the networks gateways may offer (10.0.0.0/8, " in errors[0]["message"]
    assert "--gateway-route" in errors[0]["message"]
    assert (await coord.admin.list_gateways()).gateways == []  # nothing stored


async def test_default_route_and_networks_inside_the_mesh_refused(coord):
    # the mesh is 10.254.0.0/16 (inside 10.0.0.0/8, so only the mesh rule can refuse it)
    with pytest.raises(CoordinatorError) as err:
        await coord.gateway("gw", routes=["0.0.0.0/0", "10.254.7.0/24", "10.254.0.0/16", "10.0.0.0/8"])
    assert err.value.status == 422
    fields = {e["field"]: e["message"] for e in err.value.problem["errors"]}
    assert set(fields) == {"routes.0", "routes.1", "routes.2"}  # a network covering the mesh is fine
    assert "default route" in fields["routes.0"]
    assert "inside the mesh network 10.254.0.0/16" in fields["routes.1"]


async def test_admin_list_narrows_what_gateways_offer_and_reaches_nodes(tmp_path, database_url, clock):
    coord = await start_harness(tmp_path, database_url, clock, gateway_routes=("10.96.0.0/12",))
    try:
        with pytest.raises(CoordinatorError) as err:
            await coord.gateway("gw", routes=["10.96.0.0/12", "10.244.0.0/16"])
        assert err.value.status == 422
        assert [e["field"] for e in err.value.problem["errors"]] == ["routes.1"]
        _, registered, _ = await coord.gateway("gw", endpoint="203.0.113.9:51820", routes=["10.96.0.0/12", "10.96.4.0/24"])
        _, joined, _ = await coord.join("n1")
        assert joined.config.gateway_routes == ["10.96.0.0/12"]
        (gw,) = joined.config.gateways
        assert gw.allowed_ips == ["10.254.0.0/16", "10.96.0.0/12", "10.96.4.0/24"]
    finally:
        await stop_harness(coord)


async def test_nodes_get_the_default_list(coord):
    _, joined, _ = await coord.join("n1")
    assert joined.config.gateway_routes == list(DEFAULT_GATEWAY_ROUTES)


def test_flag_parsing():
    assert gateway_routes.from_flags([]) == DEFAULT_GATEWAY_ROUTES
    assert gateway_routes.from_flags(["none"]) == ()
    assert gateway_routes.from_flags(["10.96.0.1/12", "10.96.0.0/12", " 192.168.5.0/24"]) == ("10.96.0.0/12", "192.168.5.0/24")
    for bad in (["10.96.0.0/33"], ["cluster"], ["none", "10.0.0.0/8"]):
        with pytest.raises(ConfigError) as err:
            gateway_routes.from_flags(bad)
        assert err.value.source == "--gateway-route"


def test_cli_flag_reaches_the_settings():
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    settings = cli.settings_from(parser.parse_args(["--gateway-route", "10.96.0.0/12", "--gateway-route", "10.244.0.0/16"]),
                                 environ={})
    assert settings.gateway_routes == ("10.96.0.0/12", "10.244.0.0/16")
    assert cli.settings_from(parser.parse_args([]), environ={}).gateway_routes == DEFAULT_GATEWAY_ROUTES
