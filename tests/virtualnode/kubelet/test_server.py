"""The kubelet port's application: auth before every route, logs, stats, pods, the streams hook."""

from __future__ import annotations

import asyncio
import sys
import types

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from anex_agent.errors import CoordinatorError
from anex_agent.virtualnode.kubelet import server
from tests.virtualnode.kubelet import fakes

ADMIN = {"Authorization": "Bearer admin-token"}


@pytest.fixture
async def kubelet():
    coordinator = fakes.FakeCoordinator()
    coordinator.views = [fakes.view("u1")]
    pods = [fakes.pod("train", "u1"), fakes.pod("elsewhere", "u2", node="anex-runpod")]
    client = TestClient(TestServer(server.build_app(fakes.context(coordinator, pods))))
    await client.start_server()
    yield client, coordinator
    await client.close()


@pytest.mark.parametrize("path", ["/healthz", "/pods", "/containerLogs/ml/train/training", "/stats/summary",
                                  "/no/such/path"])
async def test_anonymous_requests_are_refused_before_any_route(kubelet, path):
    client, _ = kubelet
    answer = await client.get(path)
    assert answer.status == 401
    assert await answer.text() == "Unauthorized"
    answer = await client.get(path, headers={"Authorization": "Bearer not-a-token"})
    assert answer.status == 401


async def test_a_user_without_the_rbac_verb_is_403(kubelet):
    client, _ = kubelet
    answer = await client.get("/containerLogs/ml/train/training", headers={"Authorization": "Bearer nobody-token"})
    assert answer.status == 403
    assert "user=nobody, verb=get, resource=nodes, subresource(s)=[proxy]" in await answer.text()


async def test_healthz_and_pods_lists_only_this_nodes_pods(kubelet):
    client, _ = kubelet
    assert await (await client.get("/healthz", headers=ADMIN)).text() == "ok"
    doc = await (await client.get("/pods", headers=ADMIN)).json()
    assert doc["kind"] == "PodList" and doc["apiVersion"] == "v1"
    assert [p["metadata"]["name"] for p in doc["items"]] == ["train"]


async def test_logs_pass_the_options_to_the_nodes_logs_route(kubelet):
    client, coordinator = kubelet
    coordinator.log_chunks.put_nowait(b"one\ntwo\n")
    coordinator.log_chunks.put_nowait(None)
    answer = await client.get("/containerLogs/ml/train/training?tailLines=5&timestamps=true&sinceSeconds=60",
                              headers=ADMIN)
    assert answer.status == 200 and await answer.text() == "one\ntwo\n"
    ((node_id, params),) = coordinator.log_calls
    assert node_id == "node-1"
    assert params["tail"] == 5 and params["timestamps"] == 1 and "follow" not in params
    assert params["since"].endswith("Z")


async def test_follow_streams_each_chunk_as_it_comes(kubelet):
    client, coordinator = kubelet
    coordinator.log_chunks.put_nowait(b"first\n")
    answer = await client.get("/containerLogs/ml/train/training?follow=true", headers=ADMIN)
    assert answer.status == 200
    assert await answer.content.readline() == b"first\n"  # the log is still open upstream
    coordinator.log_chunks.put_nowait(b"second\n")
    assert await answer.content.readline() == b"second\n"
    assert coordinator.log_calls[0][1]["follow"] == 1
    answer.close()  # kubectl's ^C: the upstream read ends too
    await asyncio.wait_for(coordinator.log_closed.wait(), 30)


async def test_limit_bytes_cuts_the_answer(kubelet):
    client, coordinator = kubelet
    for chunk in (b"abcdef", b"ghij", None):
        coordinator.log_chunks.put_nowait(chunk)
    answer = await client.get("/containerLogs/ml/train/training?limitBytes=8", headers=ADMIN)
    assert await answer.read() == b"abcdefgh"


@pytest.mark.parametrize("query, status, text", [
    ("previous=true", 400, 'previous terminated container "training" in pod "train" not found'),
    ("tailLines=x", 400, '{"message": "Unable to decode query."}'),
    ("tailLines=-1", 422, '{"message": "Invalid request."}'),
    ("limitBytes=0", 422, '{"message": "Invalid request."}'),
    ("sinceSeconds=5&sinceTime=2026-11-27T10:00:00Z", 422, '{"message": "Invalid request."}'),
    ("stream=Both", 400, 'invalid stream type "Both"'),
])
async def test_log_options_answered_as_the_kubelet_answers(kubelet, query, status, text):
    client, coordinator = kubelet
    answer = await client.get(f"/containerLogs/ml/train/training?{query}", headers=ADMIN)
    assert (answer.status, await answer.text()) == (status, text)
    assert coordinator.log_calls == []


@pytest.mark.parametrize("path, text", [
    ("/containerLogs/ml/nope/training", 'pod "nope" does not exist'),
    ("/containerLogs/ml/elsewhere/training", 'pod "elsewhere" does not exist'),  # another Node's pod
    ("/containerLogs/ml/train/sidecar", 'container "sidecar" not found in pod "train"'),
])
async def test_unknown_pods_and_containers_are_404(kubelet, path, text):
    client, _ = kubelet
    answer = await client.get(path, headers=ADMIN)
    assert (answer.status, await answer.text()) == (404, text)


async def test_a_pod_whose_machine_is_not_ready_is_503(kubelet):
    client, coordinator = kubelet
    coordinator.views = [fakes.view("u1", state=fakes.ProvisionState.renting, node_id=None)]
    answer = await client.get("/containerLogs/ml/train/training", headers=ADMIN)
    assert answer.status == 503 and "renting" in await answer.text()


async def test_a_node_with_no_log_is_404_with_the_coordinators_detail(kubelet):
    client, coordinator = kubelet
    coordinator.log_chunks.put_nowait(CoordinatorError("GET logs: 404", status=404,
                                                       problem={"detail": "the agent runs no workload"}))
    answer = await client.get("/containerLogs/ml/train/training", headers=ADMIN)
    assert answer.status == 404 and "the agent runs no workload" in await answer.text()


async def test_stats_and_resource_metrics_from_the_machines_telemetry(kubelet):
    client, coordinator = kubelet
    coordinator.telemetry["node-1"] = {"taken_at": 1000.0, "host": {"cpu_count": 4, "cpu_util_pct": 50.0,
                                                                    "mem_total_bytes": 100, "mem_available_bytes": 40}}
    doc = await (await client.get("/stats/summary", headers=ADMIN)).json()
    assert doc["node"]["nodeName"] == fakes.NODE
    assert [p["podRef"]["name"] for p in doc["pods"]] == ["train"]
    assert doc["pods"][0]["containers"][0]["memory"]["workingSetBytes"] == 60
    text = await (await client.get("/metrics/resource", headers=ADMIN)).text()
    assert 'container_memory_working_set_bytes{container="training",namespace="ml",pod="train"} 60 1000000' in text
    assert text.endswith("scrape_error 0\n")
    coordinator.down = True
    answer = await client.get("/stats/summary", headers=ADMIN)
    assert answer.status == 503 and "connection refused" not in await answer.text()  # the error's text: logged only
    assert (await (await client.get("/metrics/resource", headers=ADMIN)).text()).endswith("scrape_error 1\n")


async def test_the_streams_module_adds_its_routes_when_present(monkeypatch):
    seen = []

    async def hello(request):
        return web.Response(text="streams")

    def add_routes(app, context):
        seen.append(context.node_name)
        app.router.add_post("/exec/{namespace}/{pod}/{container}", hello)

    module = types.ModuleType(server.STREAMS_MODULE)
    module.add_routes = add_routes
    monkeypatch.setitem(sys.modules, server.STREAMS_MODULE, module)
    app = server.build_app(fakes.context(fakes.FakeCoordinator(), []))
    assert seen == [fakes.NODE]
    async with TestClient(TestServer(app)) as client:
        assert (await client.post("/exec/ml/train/training")).status == 401  # auth still comes first
        assert await (await client.post("/exec/ml/train/training", headers=ADMIN)).text() == "streams"


async def test_followed_logs_hold_a_stream_slot_and_none_free_is_429():
    coordinator = fakes.FakeCoordinator()
    coordinator.views = [fakes.view("u1")]
    ctx = fakes.context(coordinator, [fakes.pod("train", "u1")])
    ctx.slots.limit = 1
    async with TestClient(TestServer(server.build_app(ctx))) as client:
        coordinator.log_chunks.put_nowait(b"first\n")
        first = await client.get("/containerLogs/ml/train/training?follow=true", headers=ADMIN)
        assert await first.content.readline() == b"first\n"
        second = await client.get("/containerLogs/ml/train/training?follow=true", headers=ADMIN)
        assert second.status == 429 and "at most 1" in await second.text()
        coordinator.log_chunks.put_nowait(None)  # the first ends: its slot is free again
        assert await first.read() == b""
        coordinator.log_chunks.put_nowait(b"again\n")
        third = await client.get("/containerLogs/ml/train/training?follow=true", headers=ADMIN)
        assert third.status == 200 and await third.content.readline() == b"again\n"
        assert ctx.slots.open == 1
        third.close()


async def test_a_coordinator_that_cannot_be_read_is_503_naming_the_pod(kubelet):
    client, coordinator = kubelet
    coordinator.down = True
    answer = await client.get("/containerLogs/ml/train/training", headers=ADMIN)
    assert answer.status == 503
    text = await answer.text()
    assert 'the machine of pod "train" cannot be found now' in text and "connection refused" not in text
