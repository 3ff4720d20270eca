"""The REST API against the real aiohttp app, on SQLite and (when configured) PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import shutil

import aiohttp
import pytest

from anex_agent.wire import access_token, keys
from anex_agent.wire.gateways import GatewayRegisterRequest
from anex_agent.wire.heartbeat import Heartbeat, NodeState, TransportStatus
from anex_agent.wire.nodes import Health, TunnelSpec
from anex_agent.client.rest import proven_body
from anex_agent.coordinator import changes
from anex_agent.errors import CoordinatorError
from tests.coordinator.conftest import start_harness, stop_harness
from tests.coordinator.lock_waits import PausedBefore, another_waits
from tests.polling import wait_until


async def raw(coord, method, path, *, token=None, body=None, content_type="application/json"):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if body is not None and content_type:
        headers["Content-Type"] = content_type
    async with aiohttp.ClientSession() as session:
        async with session.request(method, coord.url + path, headers=headers, data=body) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), await resp.read()


async def test_join_returns_address_config_and_credential(coord):
    _, gw, _ = await coord.gateway("gw1", endpoint="203.0.113.1:51820", ws_url="wss://gw.example/ws",
                                   routes=["10.96.0.0/12"])
    client, joined, pair = await coord.join("n1", labels={"pool": "a"})
    config = joined.config
    assert joined.credential.startswith("anexnc_")
    assert config.network == "10.254.0.0/16"
    assert config.address == "10.254.0.2"  # .1 went to the gateway
    assert config.dns == [gw.address]
    assert [g.id for g in config.gateways] == [gw.gateway_id]
    assert config.gateways[0].allowed_ips == ["10.254.0.0/16", "10.96.0.0/12"]
    assert config.gateways[0].endpoint == "203.0.113.1:51820"
    assert config.agent_api_verify_key == coord.ctx.verify_key
    view = await coord.admin.get_node(joined.node_id)
    assert view.state == NodeState.pending
    assert view.labels == {"pool": "a"}
    assert view.public_key == pair.public_b64
    assert (await client.get_config(joined.node_id)) == config


async def test_rejoin_same_key_keeps_node_and_address_and_rotates_credential(coord):
    token = await coord.admin.create_join_token(reusable=True)
    pair = keys.KeyPair(keys.generate_private_key())
    first = await coord.client().join(token.token, pair, "n", "onprem")
    second = await coord.client().join(token.token, pair, "n-renamed", "onprem")
    assert second.node_id == first.node_id
    assert second.config.address == first.config.address
    assert second.credential != first.credential
    with pytest.raises(CoordinatorError) as err:
        await coord.client(first.credential).get_config(first.node_id)
    assert err.value.status == 401 and not err.value.retryable
    assert (await coord.admin.get_node(first.node_id)).name == "n-renamed"


async def test_single_use_token_rejoins_only_for_its_own_key(coord):
    token = await coord.admin.create_join_token()
    pair = keys.KeyPair(keys.generate_private_key())
    first = await coord.client().join(token.token, pair, "n", "vastai")
    again = await coord.client().join(token.token, pair, "n", "vastai")  # restarted agent
    assert again.node_id == first.node_id
    other = keys.KeyPair(keys.generate_private_key())
    with pytest.raises(CoordinatorError) as used:
        await coord.client().join(token.token, other, "other", "vastai")
    with pytest.raises(CoordinatorError) as unknown:
        await coord.client().join("anexjt_" + "x" * 43, other, "other", "vastai")
    expired_token = await coord.admin.create_join_token(expires_in=10)
    coord.clock.advance(11)
    with pytest.raises(CoordinatorError) as expired:
        await coord.client().join(expired_token.token, other, "other", "vastai")
    gw_token = await coord.admin.create_join_token("gateway")
    with pytest.raises(CoordinatorError) as wrong_kind:
        await coord.client().join(gw_token.token, other, "other", "vastai")
    problems = [e.value.problem for e in (used, unknown, expired, wrong_kind)]
    assert all(e.value.status == 401 for e in (used, unknown, expired, wrong_kind))
    # the holder of a real token learns what happened to it; an unknown one is only "not valid"
    assert [p["reason"] for p in problems] == ["used_up", "unknown", "expired", "kind"]
    assert all(p["errors"][0]["field"] == "token" for p in problems)
    assert unknown.value.problem["errors"][0]["message"] == "not valid (no such token: never issued, or revoked)"
    assert "used up" in used.value.problem["detail"] and "expired at" in expired.value.problem["detail"]
    assert "gateway join token; this needs a node join token" in wrong_kind.value.problem["detail"]
    assert len((await coord.admin.list_nodes()).nodes) == 1  # nothing half-written


@pytest.mark.parametrize(
    "patch, field",
    [
        ({"public_key": "not-a-key"}, "public_key"),
        ({"public_key": "AAAA"}, "public_key"),
        ({"provider": "aws"}, "provider"),
        ({"name": ""}, "name"),
        ({"surprise": 1}, "surprise"),
    ],
)
async def test_bad_join_input_is_a_problem_naming_the_field(coord, patch, field):
    token = await coord.admin.create_join_token()
    body = {"token": token.token, "public_key": keys.KeyPair(keys.generate_private_key()).public_b64,
            "name": "n", "provider": "vastai", **patch}
    status, ctype, payload = await raw(coord, "POST", "/v1/nodes", body=json.dumps(body))
    assert status == 422
    assert ctype.startswith("application/problem+json")
    doc = json.loads(payload)
    assert doc["status"] == 422
    assert field in [e["field"] for e in doc["errors"]]
    assert all(e["message"] for e in doc["errors"])


async def test_malformed_json_and_missing_body_are_400(coord):
    status, ctype, payload = await raw(coord, "POST", "/v1/nodes", body=b"{nope")
    assert status == 400 and ctype.startswith("application/problem+json")
    assert "JSON" in json.loads(payload)["detail"]
    status, _, _ = await raw(coord, "POST", "/v1/nodes")
    assert status == 400


async def test_admin_routes_need_the_admin_token(coord):
    client, joined, _ = await coord.join()
    for token in (None, "wrong", joined.credential):
        status, ctype, payload = await raw(coord, "GET", "/v1/nodes", token=token)
        assert status == 401, token
        assert ctype.startswith("application/problem+json")
    status, _, _ = await raw(coord, "GET", "/v1/nodes", token=coord.ctx.admin_token)
    assert status == 200


async def test_heartbeat_makes_node_ready_and_stores_status_and_telemetry(coord):
    client, joined, _ = await coord.join()
    telemetry = {"gpus": [{"index": 0, "util": 93}], "health": {"verdict": "degraded", "reasons": ["xid 79"]}}
    beat = Heartbeat(
        status=TransportStatus(engine="userspace", path="udp", last_handshake_age=3.5, rx_bytes=10, tx_bytes=20),
        config_version=joined.config.version,
        telemetry=telemetry,
    )
    ack = await client.heartbeat(joined.node_id, beat)
    assert ack.state == NodeState.ready
    assert ack.config_version == joined.config.version
    assert ack.next_heartbeat_in == coord.ctx.settings.timings.heartbeat_interval
    view = await coord.admin.get_node(joined.node_id)
    assert view.state == NodeState.ready
    assert view.status.engine == "userspace" and view.status.rx_bytes == 10
    assert view.health == Health.degraded and view.health_reasons == ["xid 79"]
    stored = await client.get_telemetry(joined.node_id)
    assert stored.telemetry == telemetry
    assert (await coord.admin.get_telemetry(joined.node_id)).telemetry == telemetry


async def test_nodes_cannot_act_on_other_nodes(coord):
    a, ja, _ = await coord.join("a")
    b, jb, _ = await coord.join("b")
    for call in (
        lambda: a.heartbeat(jb.node_id, Heartbeat()),
        lambda: a.get_config(jb.node_id),
        lambda: a.get_telemetry(jb.node_id),
    ):
        with pytest.raises(CoordinatorError) as err:
            await call()
        assert err.value.status == 403
    with pytest.raises(CoordinatorError) as err:
        await coord.client("anexnc_forged").heartbeat(ja.node_id, Heartbeat())
    assert err.value.status == 401


async def test_tunnels_pushed_while_the_labels_change_wait_for_them_without_a_deadlock(coord):
    """A label change (or a re-join) locks the node's row, then takes the change log's version; a
    tunnels push locks the row before the version too, so it waits for the label change instead
    of holding the version while waiting for the row (on PostgreSQL: a deadlock, one of the two
    aborted)."""
    _, joined, _ = await coord.join()
    db = coord.ctx.db
    tunnels = [TunnelSpec(listen_port=5432, target="postgres.db.svc:5432")]
    async with db.transaction() as labels:  # an admin's label change on another coordinator
        await labels.execute("UPDATE nodes SET labels = labels WHERE id = $1", joined.node_id)
        pushing = asyncio.create_task(coord.admin.put_tunnels(joined.node_id, tunnels))
        await wait_until(lambda: another_waits(db), what="the tunnels push to wait for the node's row")
        await changes.append(db, labels, changes.Scope.ONE_NODE, changes.ChangeType.LABELS, target=joined.node_id,
                             payload={"labels": {}}, now=coord.clock())
    config = await pushing
    assert config.tunnels == tunnels


async def test_tunnels_push_bumps_config_version(coord):
    client, joined, _ = await coord.join()
    tunnels = [TunnelSpec(listen_port=5432, target="postgres.db.svc:5432")]
    config = await coord.admin.put_tunnels(joined.node_id, tunnels)
    assert config.tunnels == tunnels
    assert config.version > joined.config.version
    assert (await client.get_config(joined.node_id)).tunnels == tunnels
    ack = await client.heartbeat(joined.node_id, Heartbeat())
    assert ack.config_version == config.version
    status, _, payload = await raw(
        coord, "PUT", f"/v1/nodes/{joined.node_id}/tunnels", token=coord.ctx.admin_token,
        body=json.dumps({"tunnels": [{"listen_port": 1, "target": "a:1"}, {"listen_port": 1, "target": "b:2"}]}),
    )
    assert status == 422 and json.loads(payload)["errors"][0]["field"] == "tunnels"
    status, _, payload = await raw(
        coord, "PUT", f"/v1/nodes/{joined.node_id}/tunnels", token=coord.ctx.admin_token,
        body=json.dumps({"tunnels": [{"listen_port": 70000, "target": "nohostport"}]}),
    )
    fields = [e["field"] for e in json.loads(payload)["errors"]]
    assert status == 422 and "tunnels.0.listen_port" in fields and "tunnels.0.target" in fields


async def test_delete_node_frees_address_after_quarantine_and_revokes(coord):
    client, joined, _ = await coord.join("a")
    await coord.admin.delete_node(joined.node_id)
    with pytest.raises(CoordinatorError) as err:
        await coord.admin.get_node(joined.node_id)
    assert err.value.status == 404 and err.value.problem["status"] == 404
    with pytest.raises(CoordinatorError) as err:
        await client.heartbeat(joined.node_id, Heartbeat())
    assert err.value.status == 401
    _, second, _ = await coord.join("b")
    assert second.config.address != joined.config.address  # quarantined
    coord.clock.advance(coord.ctx.settings.address_quarantine + 1)
    # the sequential pool still has room, so the next node takes the next address...
    _, third, _ = await coord.join("c")
    assert third.config.address not in (joined.config.address, second.config.address)


async def test_gateway_peer_set_and_listing(coord):
    gw_client, gw, _ = await coord.gateway("gw", endpoint="198.51.100.7:51820")
    assert gw.peers.peers == []
    _, n1, p1 = await coord.join("n1")
    peers = await gw_client.get_peers(gw.gateway_id)
    assert [(p.node_id, p.public_key, p.allowed_ips) for p in peers.peers] == [
        (n1.node_id, p1.public_b64, [f"{n1.config.address}/32"])
    ]
    assert peers.version >= n1.config.version
    listed = await coord.admin.list_gateways()
    assert [g.id for g in listed.gateways] == [gw.gateway_id]
    assert listed.gateways[0].endpoint == "198.51.100.7:51820"
    other_client, other, _ = await coord.gateway("gw2")
    with pytest.raises(CoordinatorError) as err:
        await other_client.get_peers(gw.gateway_id)
    assert err.value.status == 403


async def test_access_token_verifies_with_the_config_key(coord):
    _, joined, _ = await coord.join()
    issued = await coord.admin.create_access_token(joined.node_id)
    claims = access_token.verify(
        joined.config.agent_api_verify_key, issued.token, node_id=joined.node_id, now=coord.clock()
    )
    assert claims.node_id == joined.node_id
    with pytest.raises(access_token.InvalidAccessToken):
        access_token.verify(joined.config.agent_api_verify_key, issued.token, node_id="n-other", now=coord.clock())


async def test_openapi_documents_every_route(coord):
    status, _, payload = await raw(coord, "GET", "/v1/openapi.json")
    doc = json.loads(payload)
    assert status == 200 and doc["openapi"].startswith("3.")
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    served = {(r.method, r.path) for r in coord.server.app[__import__(
        "anex_agent.coordinator.app", fromlist=["REGISTRY_KEY"]).REGISTRY_KEY].routes}
    assert documented == served
    for needed in [("POST", "/v1/join-tokens"), ("POST", "/v1/nodes"), ("GET", "/v1/nodes"),
                   ("GET", "/v1/nodes/{node_id}"), ("DELETE", "/v1/nodes/{node_id}"),
                   ("POST", "/v1/nodes/{node_id}/heartbeat"), ("GET", "/v1/nodes/{node_id}/config"),
                   ("PUT", "/v1/nodes/{node_id}/tunnels"), ("POST", "/v1/gateways"),
                   ("GET", "/v1/gateways/{gateway_id}/peers"), ("GET", "/v1/watch"),
                   ("GET", "/v1/coordinator"), ("POST", "/v1/gateways/{gateway_id}/credential")]:
        assert needed in documented
    join = doc["paths"]["/v1/nodes"]["post"]
    assert {"201", "401", "409", "422", "503"} <= set(join["responses"])
    assert "403" in doc["paths"]["/v1/nodes/{node_id}/heartbeat"]["post"]["responses"]
    ref = join["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    assert {"public_key", "proof"} <= set(doc["components"]["schemas"][ref]["properties"])


async def test_health_ready_metrics_and_unknown_route(coord):
    client, joined, _ = await coord.join()
    await client.heartbeat(joined.node_id, Heartbeat())
    assert (await raw(coord, "GET", "/healthz"))[0] == 200
    status, _, payload = await raw(coord, "GET", "/readyz")
    assert status == 200 and json.loads(payload)["database"] == coord.ctx.db.dialect
    status, ctype, payload = await raw(coord, "GET", "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    assert b"anex_coordinator_heartbeats_total 1.0" in payload
    status, ctype, _ = await raw(coord, "GET", "/v1/nothing")
    assert status == 404 and ctype.startswith("application/problem+json")
    status, ctype, payload = await raw(coord, "PATCH", "/v1/nodes")
    assert status == 405 and ctype.startswith("application/problem+json")
    assert "GET" in json.loads(payload)["detail"] and "POST" in json.loads(payload)["detail"]


async def test_network_exhausted_is_503(tmp_path, database_url, clock):
    from tests.coordinator.conftest import start_harness, stop_harness

    coord = await start_harness(tmp_path, database_url, clock, network="10.9.0.0/30")
    try:
        await coord.join("a")
        await coord.join("b")  # a /30 has two usable addresses
        with pytest.raises(CoordinatorError) as err:
            await coord.join("c")
        assert err.value.status == 503 and err.value.retryable
        assert "10.9.0.0/30" in err.value.problem["detail"]
        assert len((await coord.admin.list_nodes()).nodes) == 2
    finally:
        await stop_harness(coord)


async def test_gateway_registration_on_an_exhausted_network_is_503_with_retry_after(tmp_path, database_url, clock):
    from tests.coordinator.conftest import start_harness, stop_harness

    coord = await start_harness(tmp_path, database_url, clock, network="10.9.0.0/30")
    try:
        await coord.join("a")
        await coord.gateway("gw1")  # nodes and gateways share the two usable addresses
        token = await coord.admin.create_join_token("gateway")
        body = json.dumps(proven_body(
            GatewayRegisterRequest, {"token": token.token, "name": "gw2", "endpoint": "203.0.113.9:51820"},
            keys.KeyPair(keys.generate_private_key()), coord.ctx.coordinator_public, now=coord.clock(),
        )).encode()
        headers = {"Content-Type": "application/json"}
        async with aiohttp.ClientSession() as session:
            async with session.post(coord.url + "/v1/gateways", data=body, headers=headers) as resp:
                assert resp.status == 503, await resp.text()
                assert resp.headers.get("Retry-After") == "60"
                assert "10.9.0.0/30" in (await resp.json(content_type=None))["detail"]
        assert len((await coord.admin.list_gateways()).gateways) == 1
    finally:
        await stop_harness(coord)


async def test_gateway_endpoint_must_be_host_port_422_naming_it(coord):
    """Every node dials the endpoint: a malformed one is refused at registration, not pushed to the fleet."""
    token = await coord.admin.create_join_token("gateway")
    pair = keys.KeyPair(keys.generate_private_key())
    for bad in ("nonsense", "203.0.113.9", "203.0.113.9:0", "203.0.113.9:70000"):
        body = json.dumps({"token": token.token, "public_key": pair.public_b64, "name": "gw", "endpoint": bad})
        status, ctype, payload = await raw(coord, "POST", "/v1/gateways", body=body.encode())
        assert status == 422 and ctype.startswith("application/problem+json"), payload
        assert [e["field"] for e in json.loads(payload)["errors"]] == ["endpoint"]
    assert (await coord.admin.list_gateways()).gateways == []


async def test_a_gateway_deleted_while_it_registers_again_is_not_told_it_registered(coord):
    """An admin's delete (on another coordinator) commits while the gateway registers again with
    its single-use token: the registration waits for the delete and finds no gateway of that key,
    so the used token is refused (401) instead of a credential for a gateway that is gone.
    (PostgreSQL runs READ COMMITTED: with a plain read of the key's gateway, the registration
    updated no row and answered 201.)"""
    token = await coord.admin.create_join_token("gateway")
    pair = keys.KeyPair(keys.generate_private_key())
    first = await coord.client().register_gateway(token.token, pair, "gw")
    db = coord.ctx.db
    async with db.transaction() as delete:  # the admin's DELETE on another coordinator, not yet committed
        await delete.execute("DELETE FROM gateways WHERE id = $1", first.gateway_id)
        again = asyncio.create_task(coord.client().register_gateway(token.token, pair, "gw"))
        await wait_until(lambda: another_waits(db), what="the registration to wait for the delete")
    with pytest.raises(CoordinatorError) as err:
        await again
    assert err.value.status == 401 and err.value.problem["errors"][0]["field"] == "token"
    assert await db.fetchval("SELECT COUNT(*) FROM gateways") == 0


async def test_a_key_is_either_a_node_or_a_gateway_409_naming_public_key(coord):
    _, _, node_pair = await coord.join("n1")
    gw_token = await coord.admin.create_join_token("gateway")
    with pytest.raises(CoordinatorError) as err:
        await coord.client().register_gateway(gw_token.token, node_pair, "gw")
    assert err.value.status == 409
    assert err.value.problem["errors"] == [{"field": "public_key", "message": "already used by a node"}]
    _, _, gw_pair = await coord.gateway("gw")
    with pytest.raises(CoordinatorError) as err:
        await coord.join("n2", key=gw_pair)
    assert err.value.status == 409
    assert err.value.problem["errors"] == [{"field": "public_key", "message": "already used by a gateway"}]
    assert len((await coord.admin.list_nodes()).nodes) == 1
    assert len((await coord.admin.list_gateways()).gateways) == 1


async def test_a_node_and_a_gateway_with_one_key_on_two_coordinators_at_once_one_is_the_409(tmp_path, database_url,
                                                                                             clock):
    """A node joins on one coordinator while a gateway registers with the same public key on
    another: whatever the timing, one of them is the 409 naming ``public_key``. Neither row exists
    while each looks for the other's, so no row lock orders them; the lookups run under a lock on
    the key. (PostgreSQL runs READ COMMITTED: with plain reads, both were admitted.)"""
    node_side = await start_harness(tmp_path / "0", database_url, clock)
    (tmp_path / "1").mkdir()
    for name in ("access-token-signing-key", "coordinator-key", "ssh-ca-key"):  # shared by coordinators on one database
        shutil.copy(tmp_path / "0" / name, tmp_path / "1")
    gateway_side = await start_harness(tmp_path / "1", database_url, clock)
    db = node_side.ctx.db
    try:
        pair = keys.KeyPair(keys.generate_private_key())
        node_token = await node_side.admin.create_join_token()
        gateway_token = await node_side.admin.create_join_token("gateway")
        node_side.ctx.db = paused = PausedBefore(db, "UPDATE nodes SET config_version")  # its row is written
        joining = asyncio.create_task(node_side.client().join(node_token.token, pair, "n", "other"))
        await wait_until(paused.paused.is_set, what="the node's join to write its row")
        registering = asyncio.create_task(gateway_side.client().register_gateway(gateway_token.token, pair, "gw"))
        await wait_until(lambda: registering.done() or another_waits(gateway_side.ctx.db),
                         what="the gateway's registration to end or wait for the join")
        paused.go.set()
        results = await asyncio.gather(joining, registering, return_exceptions=True)
        refused = [r for r in results if isinstance(r, CoordinatorError)]
        assert len(refused) == 1 and refused[0].status == 409, results
        assert refused[0].problem["errors"][0]["field"] == "public_key"
    finally:
        node_side.ctx.db = db
        for side in (node_side, gateway_side):
            await stop_harness(side)


async def test_join_tokens_are_listed_without_secrets_and_can_be_revoked(coord):
    single = await coord.admin.create_join_token(labels={"pool": "x"})
    reusable = await coord.admin.create_join_token(reusable=True)
    _, joined, pair = await coord.join(key=None)
    client = coord.client()
    await client.join(single.token, keys.KeyPair(keys.generate_private_key()), "uses-single", "other")
    listed = {t.id: t for t in (await coord.admin.list_join_tokens()).tokens}
    assert listed[single.id].used_by is not None and listed[single.id].use_count == 1
    assert listed[single.id].labels == {"pool": "x"}
    assert listed[reusable.id].used_at is None
    status, _, payload = await raw(coord, "GET", "/v1/join-tokens", token=coord.ctx.admin_token)
    assert single.token not in payload.decode() and reusable.token not in payload.decode()
    await coord.admin.revoke_join_token(reusable.id)
    with pytest.raises(CoordinatorError) as err:
        await coord.client().join(reusable.token, keys.KeyPair(keys.generate_private_key()), "n", "other")
    assert err.value.status == 401
    with pytest.raises(CoordinatorError) as err:
        await coord.admin.revoke_join_token(reusable.id)
    assert err.value.status == 404
