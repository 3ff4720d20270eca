"""PATCH/DELETE /v1/nodes/{node_id}/labels on the real coordinator app (SQLite; PostgreSQL when
ANEX_TEST_POSTGRES_URL is set): validation, maintenance, qualification policy per node, the
watch stream, concurrent updates."""

from __future__ import annotations

import asyncio

from anex_agent.wire import keys
from anex_agent.wire.heartbeat import Heartbeat
from anex_agent.client.rest import CoordinatorClient
from anex_agent.coordinator import changes
from tests.selection.test_api import api, database_url, telemetry  # noqa: F401  (fixtures)
from tests.selection.test_doc_examples import CURRENT_EXAMPLE_POD

LABELS = {"price-per-hour": "0.30", "country": "CZ", "download-mbps": "10000"}


async def joined_node(api, name="dgx", labels=LABELS, tele=None):
    """(node id, a client holding its credential)."""
    token = await api.admin.create_join_token(labels=labels)
    client = CoordinatorClient(str(api.server.make_url("")).rstrip("/"))
    joined = await client.join(token.token, keys.KeyPair(keys.generate_private_key()), name, "onprem")
    client.credential = joined.credential
    await client.heartbeat(joined.node_id, Heartbeat(telemetry=tele or telemetry()))
    return joined, client


async def onprem_ids(api, annotations=CURRENT_EXAMPLE_POD):
    _, _, body = await api.call("POST", "/v1/selections", {"annotations": annotations, "providers": ["onprem"]})
    return [c["offer_id"] for c in body["candidates"]], body["explanation"]["providers"]["onprem"].get("skipped", {})


async def test_set_normalize_and_remove_labels(api):
    joined, client = await joined_node(api)
    await client.close()
    node = joined.node_id
    status, _, body = await api.call("PATCH", f"/v1/nodes/{node}/labels",
                                     {"set": {"busy": "TRUE", "country": "de", "team": "vision"}, "remove": ["nope"]})
    assert status == 200, body
    assert body["labels"] == {**LABELS, "busy": "true", "country": "DE", "team": "vision"}
    assert body["node_id"] == node and body["version"] > joined.config.version
    _, _, view = await api.call("GET", f"/v1/nodes/{node}")
    assert view["labels"] == body["labels"]
    status, _, body = await api.call("PATCH", f"/v1/nodes/{node}/labels", {"remove": ["busy", "team"]})
    assert status == 200 and body["labels"] == {**LABELS, "country": "DE"}
    status, _, _ = await api.call("DELETE", f"/v1/nodes/{node}/labels/country")
    assert status == 204
    status, ctype, body = await api.call("DELETE", f"/v1/nodes/{node}/labels/country")
    assert status == 404 and ctype.startswith("application/problem+json") and "country" in body["detail"]
    _, _, view = await api.call("GET", f"/v1/nodes/{node}")
    assert "country" not in view["labels"]


async def test_bad_labels_are_422_naming_each_field(api):
    joined, client = await joined_node(api)
    await client.close()
    status, ctype, body = await api.call("PATCH", f"/v1/nodes/{joined.node_id}/labels", {"set": {
        "maintenance": "soon", "price-per-hour": "-1", "country": "Atlantis", "qualification": "strict",
        "bad key": "x", "team": "ok"}, "remove": ["team"]})
    assert status == 422 and ctype.startswith("application/problem+json")
    fields = {e["field"] for e in body["errors"]}
    assert fields == {"set.maintenance", "set.price-per-hour", "set.country", "set.qualification", "set.bad key",
                      "set.team"}
    _, _, view = await api.call("GET", f"/v1/nodes/{joined.node_id}")
    assert view["labels"] == LABELS  # nothing applied


async def test_unknown_node_is_404_and_admin_only(api):
    status, ctype, _ = await api.call("PATCH", "/v1/nodes/n-missing/labels", {"set": {"busy": "true"}})
    assert status == 404 and ctype.startswith("application/problem+json")
    joined, client = await joined_node(api)
    status, _, _ = await api.call("PATCH", f"/v1/nodes/{joined.node_id}/labels", {"set": {"busy": "false"}},
                                  token=None)
    assert status == 401
    status, _, _ = await api.call("PATCH", f"/v1/nodes/{joined.node_id}/labels", {"set": {"busy": "false"}},
                                  token=joined.credential)  # a node may not steer itself
    assert status in (401, 403)
    await client.close()


async def test_maintenance_keeps_a_node_out_until_removed(api):
    joined, client = await joined_node(api)
    await client.close()
    node = joined.node_id
    assert (await onprem_ids(api))[0] == [node]
    await api.call("PATCH", f"/v1/nodes/{node}/labels", {"set": {"maintenance": "true"}})
    ids, skipped = await onprem_ids(api)
    assert ids == [] and skipped[node] == "in maintenance (label maintenance=true)"
    await api.call("DELETE", f"/v1/nodes/{node}/labels/maintenance")
    assert (await onprem_ids(api))[0] == [node]


async def test_qualification_policy_per_node_names_the_rule(api):
    tele = telemetry(passed=False)
    tele["qualification"]["checks"] = [
        {"id": "tpm", "scope": "required", "status": "fail", "measured": "no TPM", "required": "TPM 2.0"},
        {"id": "memory", "scope": "marketplace", "status": "fail", "measured": "64 GiB", "required": ">= 96 GiB"}]
    joined, client = await joined_node(api, tele=tele)
    await client.close()
    node = joined.node_id
    assert (await onprem_ids(api))[0] == [node]  # default policy: runnable
    await api.call("PATCH", f"/v1/nodes/{node}/labels", {"set": {"qualification": "memory"}})
    ids, skipped = await onprem_ids(api)
    assert ids == [] and skipped[node] == ("qualification policy 'memory': rule memory failed (measured 64 GiB, "
                                           "required >= 96 GiB)")
    await api.call("PATCH", f"/v1/nodes/{node}/labels", {"set": {"qualification": "full"}})
    assert "rule tpm failed" in (await onprem_ids(api))[1][node]


async def test_a_label_change_reaches_the_watch_stream_and_the_feed(api):
    seen: list[changes.Change] = []
    api.ctx.feed.add_listener(lambda change: seen.append(change) if change.type == "labels" else None)
    joined, client = await joined_node(api)
    stream = client.watch(joined.config.version)
    try:
        await asyncio.sleep(0.2)  # let the stream connect
        _, _, body = await api.call("PATCH", f"/v1/nodes/{joined.node_id}/labels", {"set": {"busy": "true"}})
        event = await asyncio.wait_for(anext(stream), 5)
        assert event.type == "config" and event.version == body["version"]
        assert event.config.node_id == joined.node_id
    finally:
        await stream.aclose()
        await client.close()
    for _ in range(100):  # a stream that connected after the update got it from the database: the feed may lag
        if seen:
            break
        await asyncio.sleep(0.05)
    [change] = seen
    assert (change.scope, change.target, change.version) == ("node", joined.node_id, body["version"])
    assert change.payload == {"labels": {**LABELS, "busy": "true"}}


async def test_concurrent_updates_lose_nothing(api):
    joined, client = await joined_node(api)
    await client.close()
    node = joined.node_id
    answers = await asyncio.gather(*(api.call("PATCH", f"/v1/nodes/{node}/labels", {"set": {f"k{i}": str(i)}})
                                     for i in range(12)))
    assert [status for status, _, _ in answers] == [200] * 12
    assert len({body["version"] for _, _, body in answers}) == 12
    _, _, view = await api.call("GET", f"/v1/nodes/{node}")
    assert {f"k{i}": str(i) for i in range(12)}.items() <= view["labels"].items()
