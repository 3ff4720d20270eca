"""Bad input found by trying it: every answer is a problem document naming what was wrong, never a 500.

Raw-socket tests run against the production runner (:class:`anex_agent.coordinator.server.AppRunner`),
the rest against the test harness on SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
import pytest
from aiohttp import web

from anex_agent.wire import keys
from anex_agent.wire.base import LABELS_MAX, NAME_MAX, PUBLIC_KEY_PATTERN
from anex_agent.wire.gateways import GatewayList
from anex_agent.wire.heartbeat import Heartbeat, TransportStatus
from anex_agent.wire.join import JoinTokenList
from anex_agent.wire.nodes import Health, NodeConfig, NodeJoinResponse, NodeList
from anex_agent.coordinator import server as http_server
from anex_agent.coordinator.app import build_app
from anex_agent.coordinator.context import Coordinator
from anex_agent.coordinator.settings import Settings
from tests.sqlite_schema import migrated

WEIRD_DIGITS = ["²", "①", "٣", "３", "1" * 5000, "-1", "+1", "1_0", "0x1", "", "1.5"]
PROBLEM = "application/problem+json"


async def call(coord, method, path, *, token=None, body=None, raw_body=None, content_type="application/json"):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = raw_body if raw_body is not None else (json.dumps(body) if body is not None else None)
    if data is not None and content_type:
        headers["Content-Type"] = content_type
    async with aiohttp.ClientSession() as session:
        async with session.request(method, coord.url + path, headers=headers, data=data) as resp:
            payload = await resp.read()
            doc = json.loads(payload) if resp.content_type == PROBLEM else payload
            return resp.status, resp.content_type, doc


async def exchange(port: int, raw: bytes, *, read_timeout: float = 5.0) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes, read the answer until the server closes; return (status, headers, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), read_timeout)
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


@pytest.fixture
async def prod(tmp_path):
    """The coordinator served by the production runner on SQLite: yields (port, ctx)."""
    settings = Settings.for_tests(tmp_path / "coord", poll_interval=0.2, sweep_interval=3600)
    settings.state_dir.mkdir()
    await migrated(settings.database_url)
    ctx = await Coordinator.open(settings, environ={})
    runner = http_server.AppRunner(build_app(ctx), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1], ctx
    finally:
        await runner.cleanup()


async def gateway_credential(coord) -> str:
    client, _, _ = await coord.gateway()
    return client.credential


# ---------------------------------------------------------------- numbers in query parameters


@pytest.mark.parametrize("since", WEIRD_DIGITS)
async def test_watch_since_takes_ascii_digits_only(coord, since):
    credential = await gateway_credential(coord)
    status, ctype, doc = await call(coord, "GET", "/v1/watch?since=" + since, token=credential)
    assert (status, ctype) == (400, PROBLEM), doc
    assert doc["errors"][0]["field"] == "since" and "ASCII digits" in doc["errors"][0]["message"]


@pytest.mark.parametrize("limit", [*WEIRD_DIGITS, "0", "10001"])
async def test_offers_limit_takes_ascii_digits_in_range(coord, limit):
    status, ctype, doc = await call(coord, "GET", "/v1/offers?limit=" + limit, token=coord.ctx.admin_token)
    assert (status, ctype) == (400, PROBLEM), doc
    assert doc["errors"][0]["field"] == "limit" and "from 1 to 10000" in doc["detail"]


async def test_offers_limit_in_ascii_digits_works(coord):
    status, _, _ = await call(coord, "GET", "/v1/offers?limit=3", token=coord.ctx.admin_token)
    assert status == 200


# ---------------------------------------------------------------- Authorization header


@pytest.mark.parametrize("path", ["/v1/nodes", "/v1/join-tokens", "/v1/gateways", "/v1/nodes/n-x/config"])
async def test_non_utf8_authorization_is_401(prod, path):
    port, _ = prod
    status, headers, body = await exchange(
        port, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n".encode()
        + b"Authorization: Bearer \xff\xfe\r\n\r\n")
    assert status == 401 and headers["content-type"].startswith(PROBLEM), body
    assert headers["www-authenticate"] == "Bearer"


# ---------------------------------------------------------------- NUL characters (both databases)


async def join_body(coord, **patch):
    token = await coord.admin.create_join_token()
    return {"token": token.token, "public_key": keys.KeyPair(keys.generate_private_key()).public_b64,
            "name": "n", "provider": "vastai", **patch}


@pytest.mark.parametrize("patch, field", [
    ({"name": "a\x00b"}, "name"),
    ({"facts": {"hostname": "h\x00"}}, "facts.hostname"),
    ({"facts": {"capabilities": ["udp\x00"]}}, "facts.capabilities"),
    ({"facts": {"detect": {"engines": {"k\x00": "v"}}}}, "facts.detect"),
    ({"facts": {"agent_version": "\x00"}}, "facts.agent_version"),
])
async def test_nul_in_join_is_422_naming_the_field(coord, patch, field):
    status, ctype, doc = await call(coord, "POST", "/v1/nodes", body=await join_body(coord, **patch))
    assert (status, ctype) == (422, PROBLEM), doc
    assert [e["field"] for e in doc["errors"]] == [field]
    assert (await coord.admin.list_nodes()).nodes == []


@pytest.mark.parametrize("patch, field", [
    ({"name": "gw\x00"}, "name"),
    ({"endpoint": "gw.example\x00:51820"}, "endpoint"),
    ({"ws_url": "wss://gw.example/\x00"}, "ws_url"),
])
async def test_nul_in_gateway_registration_is_422(coord, patch, field):
    token = await coord.admin.create_join_token("gateway")
    body = {"token": token.token, "public_key": keys.KeyPair(keys.generate_private_key()).public_b64,
            "name": "gw", **patch}
    status, ctype, doc = await call(coord, "POST", "/v1/gateways", body=body)
    assert (status, ctype) == (422, PROBLEM), doc
    assert [e["field"] for e in doc["errors"]] == [field]


async def test_nul_in_labels_ban_reason_and_telemetry_is_422(coord):
    admin = coord.ctx.admin_token
    status, _, doc = await call(coord, "POST", "/v1/join-tokens", token=admin, body={"labels": {"k": "v\x00"}})
    assert status == 422 and doc["errors"][0]["field"].startswith("labels"), doc
    status, _, doc = await call(coord, "POST", "/v1/bans", token=admin, body={"machine_id": "1", "reason": "x\x00"})
    assert status == 422 and doc["errors"][0]["field"] == "reason", doc
    client, joined, _ = await coord.join()
    status, _, doc = await call(coord, "POST", f"/v1/nodes/{joined.node_id}/heartbeat", token=client.credential,
                                body={"telemetry": {"health": {"verdict": "healthy", "reasons": ["\x00"]}}})
    assert status == 422 and doc["errors"][0]["field"] == "telemetry", doc


@pytest.mark.parametrize("path", ["/v1/nodes/a%00", "/v1/gateways/g%00", "/v1/join-tokens/t%00",
                                  "/v1/bans/m%00", "/v1/nodes/a%01b/config", "/v1/nodes/" + "a" * 300])
async def test_nul_or_control_or_long_path_id_is_400_naming_it(coord, path):
    method = "GET" if path.endswith("config") or path.count("/") == 3 and "nodes" in path else "DELETE"
    status, ctype, doc = await call(coord, method, path, token=coord.ctx.admin_token)
    assert (status, ctype) == (400, PROBLEM), doc
    assert doc["errors"][0]["field"] in ("node_id", "gateway_id", "token_id", "machine_id")


# ---------------------------------------------------------------- disconnect mid-body


def _requests(ctx, route: str) -> dict[str, float]:
    out = {}
    for metric in ctx.metrics.registry.collect():
        for sample in metric.samples:
            if sample.name == "anex_coordinator_http_requests_total" and sample.labels["route"] == route:
                out[sample.labels["status"]] = sample.value
    return out


async def _disconnect_mid_body(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/nodes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n{\"token\": \"abc")
    await writer.drain()
    await asyncio.sleep(0.2)
    writer.close()
    await asyncio.sleep(0.3)


async def test_disconnect_mid_body_is_not_a_500_nor_an_error_log(prod, caplog):
    """Production runner: the body read fails; counted as 499, logged at debug."""
    port, ctx = prod
    with caplog.at_level(logging.DEBUG):
        await _disconnect_mid_body(port)
    counts = _requests(ctx, "POST /v1/nodes")
    assert counts.get("499") == 1 and "500" not in counts, counts
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


async def test_disconnect_mid_body_with_handler_cancellation(coord, caplog):
    """The test server cancels handlers of closed connections: counted as 499 too."""
    with caplog.at_level(logging.DEBUG):
        await _disconnect_mid_body(coord.server.port)
    counts = _requests(coord.ctx, "POST /v1/nodes")
    assert counts.get("499") == 1 and "500" not in counts, counts
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


# ---------------------------------------------------------------- aiohttp's own 400s


@pytest.mark.parametrize("raw", [
    b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",  # request line too long
    b"GET /v1/nodes HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 9000 + b"\r\n\r\n",  # header too long
    b"GET /v1/\xff HTTP/1.1\r\nHost: x\r\n\r\n",  # raw 0xFF in the URL
    b"GET /v1/nodes HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",  # NUL in a header
    b"GET /v1/nodes HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(200)) + b"\r\n",
])
async def test_aiohttp_own_400s_are_problem_json(prod, raw):
    port, _ = prod
    status, headers, body = await exchange(port, raw)
    assert status == 400 and headers["content-type"].startswith(PROBLEM), (headers, body)
    doc = json.loads(body)
    assert doc["status"] == 400 and doc["title"] == "Bad Request" and doc["detail"]
    assert "Traceback" not in body.decode() and "aiohttp" not in doc["detail"]


# ---------------------------------------------------------------- 415, strict types, lengths, numbers


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None,
                                          "application/json; charset=latin-1"])
async def test_body_without_json_content_type_is_415(coord, content_type):
    status, ctype, doc = await call(coord, "POST", "/v1/join-tokens", token=coord.ctx.admin_token,
                                    body={"kind": "node"}, content_type=content_type)
    assert (status, ctype) == (415, PROBLEM), doc
    assert "application/json" in doc["detail"]
    assert (await coord.admin.list_join_tokens()).tokens == []


async def test_json_with_utf8_charset_is_accepted(coord):
    status, _, _ = await call(coord, "POST", "/v1/join-tokens", token=coord.ctx.admin_token,
                              body={"kind": "node"}, content_type="application/json; charset=utf-8")
    assert status == 201 or status == 200


@pytest.mark.parametrize("body, field", [
    ({"reusable": 0}, "reusable"),
    ({"reusable": "true"}, "reusable"),
    ({"expires_in": "60"}, "expires_in"),
    ({"expires_in": 60.5}, "expires_in"),
    ({"kind": 1}, "kind"),
])
async def test_strict_types_are_422_naming_the_field(coord, body, field):
    status, ctype, doc = await call(coord, "POST", "/v1/join-tokens", token=coord.ctx.admin_token, body=body)
    assert (status, ctype) == (422, PROBLEM), doc
    assert [e["field"] for e in doc["errors"]] == [field]


@pytest.mark.parametrize("status_patch, field", [
    ({"last_handshake_age": True}, "status.last_handshake_age"),
    ({"last_handshake_age": "3"}, "status.last_handshake_age"),
    ({"rx_bytes": 1.5}, "status.rx_bytes"),
    ({"rx_bytes": -1}, "status.rx_bytes"),
    ({"last_handshake_age": -1}, "status.last_handshake_age"),
])
async def test_heartbeat_status_is_strict(coord, status_patch, field):
    client, joined, _ = await coord.join()
    status, _, doc = await call(coord, "POST", f"/v1/nodes/{joined.node_id}/heartbeat", token=client.credential,
                                body={"status": status_patch})
    assert status == 422 and [e["field"] for e in doc["errors"]] == [field], doc


@pytest.mark.parametrize("raw_body, where", [
    (b'{"status": {"last_handshake_age": NaN}}', "status.last_handshake_age"),
    (b'{"status": {"last_handshake_age": Infinity}}', "status.last_handshake_age"),
    (b'{"telemetry": {"gpus": [{"power_w": NaN}]}}', "gpus.0.power_w"),
    (b'{"telemetry": {"taken_at": -Infinity}}', "taken_at"),
    (b'{"telemetry": {"host": {"rx_bytes": -5}}}', "host.rx_bytes"),
    (b'{"telemetry": {"gpus": [{"xid_counts": {"79": -1}}]}}', "gpus.0.xid_counts.79"),
    (b'{"config_version": -1}', "config_version"),
])
async def test_non_finite_or_negative_heartbeat_numbers_are_422(coord, raw_body, where):
    client, joined, _ = await coord.join()
    status, ctype, doc = await call(coord, "POST", f"/v1/nodes/{joined.node_id}/heartbeat",
                                    token=client.credential, raw_body=raw_body)
    assert (status, ctype) == (422, PROBLEM), doc
    assert where in json.dumps(doc["errors"]), doc
    assert (await coord.admin.get_node(joined.node_id)).last_heartbeat_at is None


async def test_telemetry_of_the_agent_shape_is_accepted(coord):
    client, joined, _ = await coord.join()
    telemetry = {"v": 1, "taken_at": 1763728245.1, "health": {"verdict": "healthy", "reasons": []},
                 "gpus": [{"index": 0, "power_w": 300.5, "gpu_temp_c": 40, "xid_counts": {"79": 1}}],
                 "host": {"rx_bytes": 0, "tx_errors": 0}}
    ack = await client.heartbeat(joined.node_id, Heartbeat(telemetry=telemetry))
    assert ack.state.value == "ready"


@pytest.mark.parametrize("telemetry, field", [
    ({"gpus": "not a list"}, "telemetry.gpus"),
    ({"inventory": 3}, "telemetry.inventory"),
    ({"gpus": [{"index": 1.5}]}, "telemetry.gpus.0.index"),
    ({"gpus": [{"processes": [{"pid": "1"}]}]}, "telemetry.gpus.0.processes.0.pid"),
    ({"health": {"verdict": "x" * 33}}, "telemetry.health.verdict"),
    ({"qualification": {"required_ok": "yes"}}, "telemetry.qualification.required_ok"),
    ({"gpus": [{}] * 65}, "telemetry"),  # the bound is named with its path in the message
])
async def test_telemetry_not_of_the_model_is_422_naming_the_field(coord, telemetry, field):
    client, joined, _ = await coord.join()
    status, ctype, doc = await call(coord, "POST", f"/v1/nodes/{joined.node_id}/heartbeat",
                                    token=client.credential, body={"telemetry": telemetry})
    assert (status, ctype) == (422, PROBLEM), doc
    assert [e["field"] for e in doc["errors"]] == [field], doc
    assert (await coord.admin.get_node(joined.node_id)).last_heartbeat_at is None


async def test_telemetry_keeps_unknown_keys_and_is_served_as_sent(coord):
    """A newer agent's keys are stored and served; fields not sent are not invented (no nulls)."""
    client, joined, _ = await coord.join()
    telemetry = {"v": 2, "health": {"verdict": "degraded", "reasons": ["hot"], "since": 5},
                 "gpus": [{"index": 0, "gpu_temp_c": -3, "new_counter": 4, "processes": [{"pid": 7, "used_mib": None}]}],
                 "accelerators": [{"kind": "tpu"}]}
    status, _, _ = await call(coord, "POST", f"/v1/nodes/{joined.node_id}/heartbeat",
                              token=client.credential, body={"telemetry": telemetry})
    assert status == 200
    await coord.ctx.heartbeats.flush()
    stored = await coord.admin.get_telemetry(joined.node_id)
    assert stored.telemetry == telemetry
    node = await coord.admin.get_node(joined.node_id)
    assert (node.health, node.health_reasons) == (Health.degraded, ["hot"])


async def test_a_verdict_this_version_does_not_know_is_stored_but_leaves_health_alone(coord):
    client, joined, _ = await coord.join()
    status, _, _ = await call(coord, "POST", f"/v1/nodes/{joined.node_id}/heartbeat", token=client.credential,
                              body={"telemetry": {"health": {"verdict": "draining", "reasons": []}}})
    assert status == 200
    await coord.ctx.heartbeats.flush()
    assert (await coord.admin.get_node(joined.node_id)).health == Health.unknown
    assert (await coord.admin.get_telemetry(joined.node_id)).telemetry["health"]["verdict"] == "draining"


@pytest.mark.parametrize("where, body", [
    ("facts.hostname", {"facts": {"hostname": "h" * 10_000}}),  # 3 MB is refused whole: 413 (test_abuse)
    ("facts.hostname", {"facts": {"hostname": "h" * 254}}),
    ("name", {"name": "n" * 254}),
    ("token", {"token": "t" * 513}),
    ("facts.detect", {"facts": {"detect": {"why": "x" * 5000}}}),
])
async def test_long_strings_are_422(coord, where, body):
    status, ctype, doc = await call(coord, "POST", "/v1/nodes", body=await join_body(coord, **body))
    assert (status, ctype) == (422, PROBLEM), doc
    assert [e["field"] for e in doc["errors"]] == [where]


async def test_long_ws_url_and_bad_endpoint_are_422(coord):
    token = await coord.admin.create_join_token("gateway")
    base = {"token": token.token, "public_key": keys.KeyPair(keys.generate_private_key()).public_b64, "name": "gw"}
    for patch, field in (({"ws_url": "wss://" + "a" * 10_000}, "ws_url"), ({"ws_url": "http://x/"}, "ws_url"),
                         ({"endpoint": "gw:٣"}, "endpoint"), ({"endpoint": "2001:db8::1:51820"}, "endpoint")):
        status, _, doc = await call(coord, "POST", "/v1/gateways", body={**base, **patch})
        assert status == 422 and [e["field"] for e in doc["errors"]] == [field], doc
    assert (await coord.admin.list_gateways()).gateways == []


# ---------------------------------------------------------------- round trips and the OpenAPI document


async def test_coordinator_answers_parse_in_strict_mode_too(coord):
    """Clients parse answers in lax mode; the coordinator's own answers pass strict mode as well."""
    _, gw, _ = await coord.gateway("gw1", endpoint="[2001:db8::1]:51820", ws_url="wss://gw.example/ws",
                                   routes=["10.96.0.0/12"])
    client, joined, _ = await coord.join("n1", labels={"pool": "a"})
    await client.heartbeat(joined.node_id, Heartbeat(
        status=TransportStatus(engine="userspace", path="udp", last_handshake_age=1.5, rx_bytes=10),
        telemetry={"health": {"verdict": "healthy", "reasons": []}, "gpus": [{"power_w": 1.0}]}))
    await coord.ctx.heartbeats.flush()
    for path, model in (("/v1/nodes", NodeList), ("/v1/gateways", GatewayList),
                        (f"/v1/nodes/{joined.node_id}/config", NodeConfig),
                        ("/v1/join-tokens", JoinTokenList)):
        status, _, payload = await call(coord, "GET", path, token=coord.ctx.admin_token)
        assert status == 200
        lax = model.model_validate_json(payload)
        assert model.model_validate_json(payload, strict=True) == lax
        assert model.model_validate_json(lax.model_dump_json(), strict=True) == lax
    assert NodeJoinResponse.model_validate_json(joined.model_dump_json(), strict=True) == joined


async def test_openapi_shows_the_constraints(coord):
    status, _, payload = await call(coord, "GET", "/v1/openapi.json")
    doc = json.loads(payload)
    schemas = doc["components"]["schemas"]
    key = schemas["NodeJoinRequest"]["properties"]["public_key"]
    assert key["minLength"] == key["maxLength"] == 44 and key["pattern"] == PUBLIC_KEY_PATTERN
    assert schemas["NodeJoinRequest"]["properties"]["name"]["maxLength"] == NAME_MAX
    assert schemas["NodeFacts"]["properties"]["hostname"]["maxLength"] == NAME_MAX
    endpoint = json.dumps(schemas["GatewayRegisterRequest"]["properties"]["endpoint"])
    assert "pattern" in endpoint and "maxLength" in endpoint
    routes = json.dumps(schemas["GatewayRegisterRequest"]["properties"]["routes"])
    assert "CIDR" in routes and "pattern" in routes and "maxItems" in routes
    assert schemas["TunnelSpec"]["properties"]["listen_port"]["maximum"] == 65535
    status_props = schemas["TransportStatus"]["properties"]
    assert status_props["rx_bytes"]["minimum"] == 0 and "minimum" in json.dumps(status_props["last_handshake_age"])
    assert schemas["JoinTokenCreate"]["properties"]["labels"]["maxProperties"] == LABELS_MAX
    watch = doc["paths"]["/v1/watch"]["get"]["parameters"]
    since = next(p for p in watch if p["name"] == "since")
    assert since["schema"]["type"] == "integer" and since["schema"]["minimum"] == 0
    offers = next(p for p in doc["paths"]["/v1/offers"]["get"]["parameters"] if p["name"] == "limit")
    assert (offers["schema"]["minimum"], offers["schema"]["maximum"], offers["schema"]["default"]) == (1, 10000, 100)
    node_param = doc["paths"]["/v1/nodes/{node_id}"]["get"]["parameters"][0]
    assert node_param["schema"]["maxLength"] == 253
    assert "NUL" in doc["info"]["description"] and "without type coercion" in doc["info"]["description"]
    join = doc["paths"]["/v1/nodes"]["post"]["responses"]
    assert {"400", "415", "422"} <= set(join)
