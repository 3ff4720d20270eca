"""Proof of key possession: a public key and a reusable token are not enough to join or
register as someone else (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import os

import aiohttp
import pytest

from anex_agent.wire import keys, proof
from anex_agent.wire.gateways import GatewayRegisterRequest
from anex_agent.wire.heartbeat import Heartbeat
from anex_agent.wire.nodes import NodeJoinRequest
from anex_agent.client.rest import proven_body
from anex_agent.coordinator import coordinator_key
from anex_agent.coordinator.context import Coordinator
from anex_agent.coordinator.settings import Settings
from anex_agent.errors import ConfigError, CoordinatorError


async def post(coord, path: str, body: dict) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session:
        async with session.post(coord.url + path, data=json.dumps(body), headers={"Content-Type": "application/json"}) as resp:
            return resp.status, await resp.json(content_type=None)


def node_body(coord, token: str, key: keys.KeyPair, *, now: float | None = None, name: str = "n") -> dict:
    return proven_body(NodeJoinRequest, {"token": token, "name": name, "provider": "other"}, key,
                       coord.ctx.coordinator_public, now=coord.clock() if now is None else now)


def forged(body: dict, victim_public: str) -> dict:
    """``body`` (proven with the attacker's own key) claiming the victim's public key instead."""
    return {**body, "public_key": victim_public}


async def test_coordinator_publishes_its_key_and_keeps_it_in_a_0600_file(coord):
    info = await coord.client().coordinator_info()
    path = coord.ctx.settings.state_dir / coordinator_key.FILE_NAME
    assert path.stat().st_mode & 0o777 == 0o600
    assert info.public_key == keys.encode_key(keys.public_key(coordinator_key.load_or_create(path)))
    assert await coord.ctx.db.fetchval("SELECT value FROM settings WHERE name = $1", coordinator_key.SETTING) == info.public_key


async def test_a_second_coordinator_with_another_key_refuses_to_start(coord, tmp_path, database_url):
    other_dir = tmp_path / "other"
    settings = Settings.for_tests(other_dir, database_url)
    other_dir.mkdir()
    # the same signing key (checked first), another coordinator key
    (other_dir / "access-token-signing-key").write_bytes(
        (coord.ctx.settings.state_dir / "access-token-signing-key").read_bytes())
    os.chmod(other_dir / "access-token-signing-key", 0o600)
    with pytest.raises(ConfigError) as err:
        await Coordinator.open(settings, environ={})
    assert "coordinator-key" in str(err.value)


async def test_node_takeover_with_a_public_key_and_a_reusable_token_fails(coord):
    reusable = await coord.admin.create_join_token(reusable=True)
    victim = keys.KeyPair(keys.generate_private_key())
    victim_client = coord.client()
    joined = await victim_client.join(reusable.token, victim, "victim", "vastai")
    attacker = keys.KeyPair(keys.generate_private_key())

    no_proof = {"token": reusable.token, "public_key": victim.public_b64, "name": "evil", "provider": "other"}
    status, problem = await post(coord, "/v1/nodes", no_proof)
    assert status == 401 and "credential" not in problem
    status, _ = await post(coord, "/v1/nodes", forged(node_body(coord, reusable.token, attacker), victim.public_b64))
    assert status == 401
    # a proof for a gateway registration is no good for a node join (and the other way round)
    gateway_proof = proven_body(GatewayRegisterRequest, {"token": reusable.token, "name": "n"}, victim,
                                coord.ctx.coordinator_public, now=coord.clock())["proof"]
    status, _ = await post(coord, "/v1/nodes", {**node_body(coord, reusable.token, attacker), "proof": gateway_proof,
                                                "public_key": victim.public_b64})
    assert status == 401

    # the victim is untouched: same node, its credential works, nothing rotated
    await victim_client.heartbeat(joined.node_id, Heartbeat())
    assert (await victim_client.get_config(joined.node_id)).address == joined.config.address
    assert [n.name for n in (await coord.admin.list_nodes()).nodes] == ["victim"]


async def test_gateway_takeover_with_a_public_key_and_a_reusable_token_fails(coord):
    token = await coord.admin.create_join_token("gateway", reusable=True)
    victim = keys.KeyPair(keys.generate_private_key())
    victim_client = coord.client()
    registered = await victim_client.register_gateway(token.token, victim, "gw", endpoint="203.0.113.1:51820",
                                                      routes=["10.96.0.0/12"])
    attacker = keys.KeyPair(keys.generate_private_key())
    evil = {"token": token.token, "name": "gw", "endpoint": "198.51.100.66:51820", "routes": ["0.0.0.0/1"]}
    body = proven_body(GatewayRegisterRequest, evil, attacker, coord.ctx.coordinator_public, now=coord.clock())
    status, _ = await post(coord, "/v1/gateways", forged(body, victim.public_b64))
    assert status == 401
    status, _ = await post(coord, "/v1/gateways", {**evil, "public_key": victim.public_b64})
    assert status == 401

    [view] = (await coord.admin.list_gateways()).gateways
    assert view.endpoint == "203.0.113.1:51820" and view.routes == ["10.96.0.0/12"]
    assert (await victim_client.get_peers(registered.gateway_id)).version >= 0


async def test_the_proof_binds_the_token_and_the_other_fields(coord):
    token = await coord.admin.create_join_token(reusable=True)
    key = keys.KeyPair(keys.generate_private_key())
    body = node_body(coord, token.token, key)
    status, _ = await post(coord, "/v1/nodes", {**body, "name": "renamed-on-the-way"})
    assert status == 401
    other = await coord.admin.create_join_token(reusable=True)
    status, _ = await post(coord, "/v1/nodes", {**body, "token": other.token})
    assert status == 401
    status, _ = await post(coord, "/v1/nodes", body)
    assert status == 201


async def test_a_replayed_join_is_refused(coord):
    token = await coord.admin.create_join_token(reusable=True)
    key = keys.KeyPair(keys.generate_private_key())
    body = node_body(coord, token.token, key)
    status, first = await post(coord, "/v1/nodes", body)
    assert status == 201
    status, _ = await post(coord, "/v1/nodes", body)
    assert status == 401
    # the first join's credential still works: the replay changed nothing
    await coord.client(first["credential"]).heartbeat(first["node_id"], Heartbeat())
    # nonces are pruned only after the window, when the timestamp alone refuses the body
    coord.clock.advance(proof.WINDOW + 2)
    from anex_agent.coordinator import enrollment as registration

    assert await registration.prune_nonces(coord.ctx.db, now=coord.clock()) == 1
    status, _ = await post(coord, "/v1/nodes", body)
    assert status == 401


@pytest.mark.parametrize("skew", [-(proof.WINDOW + 1), proof.WINDOW + 1])
async def test_a_stale_or_future_timestamp_is_refused(coord, skew):
    token = await coord.admin.create_join_token(reusable=True)
    key = keys.KeyPair(keys.generate_private_key())
    status, _ = await post(coord, "/v1/nodes", node_body(coord, token.token, key, now=coord.clock() + skew))
    assert status == 401
    status, _ = await post(coord, "/v1/nodes", node_body(coord, token.token, key, now=coord.clock() + skew / 2))
    assert status == 201


async def test_a_malformed_proof_is_422_naming_it(coord):
    token = await coord.admin.create_join_token()
    key = keys.KeyPair(keys.generate_private_key())
    body = node_body(coord, token.token, key)
    status, problem = await post(coord, "/v1/nodes", {**body, "proof": {**body["proof"], "mac": "short"}})
    assert status == 422
    assert any(e["field"].startswith("proof") for e in problem["errors"])


async def test_a_restarted_node_joins_again_and_keeps_its_address_a_new_key_is_a_new_node(coord):
    token = await coord.admin.create_join_token(reusable=True)
    key = keys.KeyPair(keys.generate_private_key())
    first = await coord.client().join(token.token, key, "n", "other")
    again = await coord.client().join(token.token, key, "n", "other")  # restarted with its state dir
    assert (again.node_id, again.config.address) == (first.node_id, first.config.address)
    with pytest.raises(CoordinatorError) as err:
        await coord.client(first.credential).heartbeat(first.node_id, Heartbeat())
    assert err.value.status == 401
    fresh = await coord.client().join(token.token, keys.KeyPair(keys.generate_private_key()), "n", "other")  # lost it
    assert fresh.node_id != first.node_id and fresh.config.address != first.config.address


def test_proof_core_round_trip_and_purposes():
    coordinator = keys.generate_private_key()
    node = keys.KeyPair(keys.generate_private_key())
    fields = {"token": "t", "name": "n"}
    made = proof.make(proof.NODE_JOIN, private_key=node.private, public_key=node.public_b64,
                      coordinator_key=keys.public_key(coordinator), fields=fields, now=1000)
    proof.verify(proof.NODE_JOIN, coordinator_private=coordinator, public_key=node.public_b64, fields=fields,
                 now=1000, **made)
    for purpose, changed, now in [(proof.GATEWAY_REGISTRATION, fields, 1000), (proof.NODE_JOIN, {**fields, "name": "x"}, 1000),
                                  (proof.NODE_JOIN, fields, 1000 + proof.WINDOW + 1)]:
        with pytest.raises(proof.ProofError):
            proof.verify(purpose, coordinator_private=coordinator, public_key=node.public_b64, fields=changed, now=now,
                         **made)
    other_coordinator = keys.generate_private_key()
    with pytest.raises(proof.ProofError):
        proof.verify(proof.NODE_JOIN, coordinator_private=other_coordinator, public_key=node.public_b64, fields=fields,
                     now=1000, **made)
