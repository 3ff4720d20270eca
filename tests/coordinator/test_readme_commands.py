"""The README's commands do what its text says: its gateway join token outlives the gateway's
restarts, and its coordinator is reachable by the nodes of its own example (TLS)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import aiohttp

from anex_agent import keys

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def readme_token_body(kind: str) -> dict:
    """The JSON body of the README's ``curl ... /v1/join-tokens`` for ``kind``."""
    bodies = [json.loads(body) for body in re.findall(r"-d '(\{[^']*\})' \$COORD/v1/join-tokens", README)]
    (body,) = [b for b in bodies if b.get("kind") == kind]
    return body


async def create_raw(coord, body: dict) -> dict:
    headers = {"Authorization": f"Bearer {coord.ctx.admin_token}"}
    async with aiohttp.ClientSession() as session:
        async with session.post(coord.url + "/v1/join-tokens", headers=headers, json=body) as resp:
            assert resp.status == 201, await resp.text()
            return await resp.json()


async def test_the_readme_gateway_token_lets_its_gateway_restart_after_the_default_hour_and_a_second_join(coord):
    created = await create_raw(coord, readme_token_body("gateway"))
    assert created["kind"] == "gateway" and created["reusable"] is True
    pair = keys.KeyPair(keys.generate_private_key())
    first = await coord.client().register_gateway(created["token"], pair, "gw-a", endpoint="192.0.2.1:51820")
    coord.clock.advance(30 * 86400)  # a month later: far past a default token's hour
    again = await coord.client().register_gateway(created["token"], pair, "gw-a", endpoint="192.0.2.1:51820")
    assert again.gateway_id == first.gateway_id  # the restarted gateway registered again
    second = await coord.client().register_gateway(created["token"], keys.KeyPair(keys.generate_private_key()),
                                                   "gw-b", endpoint="192.0.2.2:51820")
    assert second.gateway_id != first.gateway_id  # a replacement or second gateway too


async def test_a_default_gateway_token_would_not_have_outlived_the_hour(coord):
    """The contrast the README's text explains: the defaults are single-use for an hour."""
    import pytest

    from anex_agent.errors import CoordinatorError

    created = await create_raw(coord, {"kind": "gateway"})
    pair = keys.KeyPair(keys.generate_private_key())
    await coord.client().register_gateway(created["token"], pair, "gw-a", endpoint="192.0.2.1:51820")
    coord.clock.advance(2 * 3600)
    with pytest.raises(CoordinatorError) as err:
        await coord.client().register_gateway(created["token"], pair, "gw-a", endpoint="192.0.2.1:51820")
    assert err.value.status == 401 and err.value.problem["reason"] == "expired"


def test_the_readme_coordinator_listens_where_its_nodes_reach_it_and_with_tls():
    (command,) = [line for line in README.splitlines() if line.strip().startswith("anex-agent coordinator")]
    assert "--listen 0.0.0.0:8700" in command and "--tls-cert" in command and "--tls-key" in command
    assert "COORD=https://" in README
