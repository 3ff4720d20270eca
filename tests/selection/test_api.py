"""REST API of machine selection against the real coordinator app (SQLite; PostgreSQL when
ANEX_TEST_POSTGRES_URL is set), with Vast.AI and RunPod served by local fake API servers.

The selection jobs run on the inline worker (this process); the worker process behind the same
API is tested in test_worker.py."""

from __future__ import annotations

import asyncio
import types

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from anex_agent.wire import keys
from anex_agent.wire.heartbeat import Heartbeat
from anex_agent.client.rest import CoordinatorClient
from anex_agent.coordinator import app as coordinator_app
from anex_agent.coordinator.routes import selection as routes_selection
from anex_agent.coordinator.context import Coordinator
from anex_agent.coordinator.settings import Settings
from anex_agent.selection.config import SelectionConfig
from anex_agent.providers.offers_http import HttpPolicy
from anex_agent.providers.runpod.offers import RunPodConfig
from anex_agent.providers.vastai.offers import VastAIConfig
from tests.coordinator.conftest import BACKENDS, FakeClock, backend_url
from tests.selection.fake_providers import FakeProvider, runpod_data
from tests.selection.test_doc_examples import CURRENT_EXAMPLE_POD, LEGACY_EXAMPLE_POD

POLICY = HttpPolicy(timeout=3.0, attempts=2, backoff=0.01, max_backoff=0.02, cache_ttl=0.0)
BAN_SECONDS = 600.0


@pytest.fixture(params=BACKENDS)
async def database_url(request, tmp_path):
    async with backend_url(request.param, tmp_path) as url:
        yield url


class Api:
    def __init__(self, server: TestServer, ctx: Coordinator, fake: FakeProvider, clock: FakeClock):
        self.server, self.ctx, self.fake, self.clock = server, ctx, fake, clock
        self.session = aiohttp.ClientSession()
        self.admin = CoordinatorClient(str(server.make_url("")).rstrip("/"), admin_token=ctx.admin_token)

    async def call(self, method: str, path: str, body=None, *, token: str | None = "admin"):
        headers = {"Authorization": f"Bearer {self.ctx.admin_token if token == 'admin' else token}"} if token else {}
        async with self.session.request(method, self.server.make_url(path), json=body, headers=headers) as resp:
            data = await resp.json(content_type=None) if resp.status != 204 else None
            return resp.status, resp.headers.get("Content-Type", ""), data

    async def onprem_node(self, name: str, *, labels: dict, telemetry: dict | None):
        token = await self.admin.create_join_token(labels=labels)
        pair = keys.KeyPair(keys.generate_private_key())
        client = CoordinatorClient(str(self.server.make_url("")).rstrip("/"))
        try:
            joined = await client.join(token.token, pair, name, "onprem")
            client.credential = joined.credential
            if telemetry is not None:
                await client.heartbeat(joined.node_id, Heartbeat(telemetry=telemetry))
        finally:
            await client.close()
        return joined.node_id


@pytest.fixture
async def api(tmp_path, database_url, request):
    fake = FakeProvider()
    fake.runpod_data = runpod_data()
    fake_server = TestServer(fake.app(), host="127.0.0.1")
    await fake_server.start_server()
    if getattr(request, "param", None) == "no-provider-keys":  # the coordinator's environment sets no key
        config = SelectionConfig(ban_seconds=BAN_SECONDS, policy=POLICY)
    else:
        config = SelectionConfig(
            vastai=VastAIConfig(api_key=fake.api_key, base_url=str(fake_server.make_url("/api/v0")), policy=POLICY),
            runpod=RunPodConfig(api_key=fake.api_key, url=str(fake_server.make_url("/graphql")), policy=POLICY),
            ban_seconds=BAN_SECONDS, policy=POLICY, ordering=getattr(request, "param", "price"))
    clock = FakeClock()
    settings = Settings.for_tests(tmp_path, database_url, poll_interval=0.2, sweep_interval=3600)
    ctx = await Coordinator.open(settings, clock=clock, environ={}, extra_migrations=routes_selection.MIGRATIONS)
    # the jobs run in this process (the inline worker): a worker process per test cost seconds of start-up
    # and exit; test_worker.py runs the API over the process and checks that both answer alike
    module = types.SimpleNamespace(setup=routes_selection.make_setup(config, worker="inline"),
                                   MIGRATIONS=routes_selection.MIGRATIONS)
    core = coordinator_app.load_modules([m for m in coordinator_app.ROUTE_MODULES
                                         if m != "anex_agent.coordinator.routes.selection"])
    server = TestServer(coordinator_app.build_app(ctx, [*core, module]))
    await server.start_server()
    harness = Api(server, ctx, fake, clock)
    try:
        yield harness
    finally:
        await harness.session.close()
        await harness.admin.close()
        await server.close()
        await fake_server.close()


def telemetry(gpu="NVIDIA GeForce RTX 4090", count=2, *, passed=True, verdict="healthy", processes=False):
    gpus = [{"index": i, "name": gpu, "uuid": f"GPU-{i}", "pci_bus_id": f"0000:0{i}:00.0",
             "memory_total_bytes": 24 * 2**30, "compute_capability": "8.9", "memory_bandwidth_gbps": 1008.1}
            for i in range(count)]
    return {"v": 1, "taken_at": 0.0, "hostname": "h", "health": {"verdict": verdict, "reasons": []},
            "nvml": {"state": "ok"},
            "inventory": {"driver_version": "550.54.15", "cuda_version": "12.4", "gpu_count": count, "gpus": gpus},
            "gpus": [{"index": i, "uuid": f"GPU-{i}", "state": "ok", "last_xid": 0,
                      **({"processes": [{"pid": 1}]} if processes else {})} for i in range(count)],
            "xids": [], "host": {"cpu_count": 32, "mem_total_bytes": 128 * 2**30,
                                 "disk": {"free_bytes": 900 * 2**30}},
            "qualification": {"v": 1, "status": "pass" if passed else "fail", "required_ok": passed,
                              "marketplace_ok": passed, "checks": []}}


@pytest.mark.parametrize("pod", [CURRENT_EXAMPLE_POD, LEGACY_EXAMPLE_POD], ids=["current", "legacy"])
async def test_selection_answers_the_reference_example_pod(api, pod):
    status, ctype, body = await api.call("POST", "/v1/selections", {"annotations": pod})
    assert status == 200, body
    ids = [(c["provider"], c["offer_id"]) for c in body["candidates"]]
    # Vast.AI: 1002 (DE, RTX 3090, 0.61) and 1001 (CZ, RTX 4090, 0.95) satisfy the pod; RunPod reports no network
    # speed, so download-speed-min excludes it (unknown never matches)
    assert ids == [("vastai", "1002"), ("vastai", "1001")]
    first = body["candidates"][0]
    assert first["machine_id"] == "502" and first["price_per_hour"] == 0.61
    assert first["matched"]["region"] == "DE" and first["matched"]["gpu-count"] == 2
    steps = {f["filter"]: f for f in body["explanation"]["filters"]}
    assert steps["download-speed"]["removed"] >= 1
    assert body["explanation"]["providers"]["vastai"]["offers"] == 2


async def test_bad_annotations_are_400_problem_details(api):
    status, ctype, body = await api.call("POST", "/v1/selections", {"annotations": {
        "anex.sh/gpu-count": "two", "anex.sh/region": "atlantis", "anex.sh/vram-min": "9", "anex.sh/vram-max": "1",
        "runpod.anex.sh/cloud-type": "SPOT", "anex.sh/colour": "red", "other.io/x": "ignored"}})
    assert status == 400 and ctype.startswith("application/problem+json")
    by_name = {e["annotation"]: e["message"] for e in body["errors"]}
    assert set(by_name) == {"anex.sh/gpu-count", "anex.sh/region", "anex.sh/vram-min", "runpod.anex.sh/cloud-type",
                            "anex.sh/colour"}
    assert "non-negative" in by_name["anex.sh/gpu-count"] and "europe" in by_name["anex.sh/region"]
    assert "SECURE or COMMUNITY" in by_name["runpod.anex.sh/cloud-type"]
    assert "-min <= -max" in by_name["anex.sh/vram-min"] and "accepts:" in by_name["anex.sh/colour"]
    assert body["errors"][0]["field"].startswith("annotations.")


async def test_selection_needs_the_admin_token(api):
    status, ctype, _ = await api.call("POST", "/v1/selections", {"annotations": {}}, token=None)
    assert status == 401 and ctype.startswith("application/problem+json")
    status, _, _ = await api.call("POST", "/v1/selections", {"annotations": {}}, token="anexadm_wrong")
    assert status == 401


async def test_body_validation_is_422(api):
    status, ctype, body = await api.call("POST", "/v1/selections", {"annotations": {}, "limit": 0})
    assert status == 422 and body["errors"][0]["field"] == "limit"
    status, _, body = await api.call("POST", "/v1/selections", {"annotations": {}, "providers": ["aws"]})
    assert status == 422


async def test_provisioning_failure_bans_the_vast_machine_until_it_expires(api):
    pod = {**CURRENT_EXAMPLE_POD}
    status, _, ack = await api.call("POST", "/v1/provisioning-failures",
                                    {"provider": "vastai", "offer_id": "1002", "machine_id": "502",
                                     "reason": "container never started"})
    assert status == 200 and ack["banned"] is True
    assert ack["ban"]["expires_at"] == pytest.approx(api.clock.now + BAN_SECONDS)
    _, _, body = await api.call("POST", "/v1/selections", {"annotations": pod})
    assert [c["offer_id"] for c in body["candidates"]] == ["1001"]
    banned_step = body["explanation"]["filters"][-1]
    assert (banned_step["filter"], banned_step["removed"]) == ("banned", 1)
    _, _, bans = await api.call("GET", "/v1/bans")
    assert [b["machine_id"] for b in bans["bans"]] == ["502"] and "container never started" in bans["bans"][0]["reason"]
    api.clock.advance(BAN_SECONDS + 1)  # the ban expires by itself
    _, _, body = await api.call("POST", "/v1/selections", {"annotations": pod})
    assert [c["offer_id"] for c in body["candidates"]] == ["1002", "1001"]
    _, _, bans = await api.call("GET", "/v1/bans")
    assert bans["bans"] == []


async def test_runpod_failures_do_not_ban(api):
    status, _, ack = await api.call("POST", "/v1/provisioning-failures",
                                    {"provider": "runpod", "offer_id": "NVIDIA GeForce RTX 4090@EU-RO-1/SECURE/x2"})
    assert status == 200 and ack["banned"] is False and "does not implement bans" in ack["detail"]
    status, _, body = await api.call("POST", "/v1/provisioning-failures", {"provider": "vastai", "offer_id": "1"})
    assert status == 400 and body["errors"][0]["field"] == "machine_id"


async def test_admin_ban_with_duration_and_lift(api):
    status, _, ban = await api.call("POST", "/v1/bans", {"machine_id": "501", "reason": "flaky", "duration": 60})
    assert status == 201 and ban["expires_at"] == pytest.approx(api.clock.now + 60)
    status, _, ban = await api.call("POST", "/v1/bans", {"machine_id": "503"})
    assert ban["expires_at"] == pytest.approx(api.clock.now + BAN_SECONDS)  # the configured default
    status, _, _ = await api.call("DELETE", "/v1/bans/501")
    assert status == 204
    status, ctype, _ = await api.call("DELETE", "/v1/bans/501")
    assert status == 404 and ctype.startswith("application/problem+json")
    status, _, body = await api.call("POST", "/v1/bans", {"machine_id": "", "duration": -1})
    assert status == 422 and {e["field"] for e in body["errors"]} == {"machine_id", "duration"}


async def test_concurrent_failure_reports_for_one_machine_all_succeed(api):
    """Several pods failing on one machine are reported at once: every report is accepted
    (no 409 from two inserts of one ban) and the ban lasts until the latest expiry."""
    reports = [api.call("POST", "/v1/provisioning-failures",
                        {"provider": "vastai", "offer_id": "1002", "machine_id": "502", "reason": f"pod {i}"})
               for i in range(8)]
    reports.append(api.call("POST", "/v1/bans", {"machine_id": "502", "duration": BAN_SECONDS * 2}))
    answers = await asyncio.gather(*reports)
    assert [status for status, _, _ in answers] == [200] * 8 + [201]
    _, _, bans = await api.call("GET", "/v1/bans")
    assert [b["machine_id"] for b in bans["bans"]] == ["502"]
    assert bans["bans"][0]["expires_at"] == pytest.approx(api.clock.now + BAN_SECONDS * 2)


async def test_cheaper_onprem_node_wins_and_unavailable_nodes_are_explained(api):
    cheap = await api.onprem_node("dgx-cheap", labels={"price-per-hour": "0.30", "country": "CZ",
                                                       "download-mbps": "10000"}, telemetry=telemetry())
    await api.onprem_node("busy", labels={"price-per-hour": "0.10", "country": "CZ", "download-mbps": "10000"},
                          telemetry=telemetry(processes=True))
    await api.onprem_node("unqualified", labels={"price-per-hour": "0.10", "country": "CZ",
                                                  "qualification": "required"},  # per join token
                          telemetry=telemetry(passed=False))
    await api.onprem_node("unhealthy", labels={"price-per-hour": "0.10", "country": "CZ"},
                          telemetry=telemetry(verdict="unhealthy"))
    await api.onprem_node("silent", labels={"price-per-hour": "0.10"}, telemetry=None)
    status, _, body = await api.call("POST", "/v1/selections", {"annotations": CURRENT_EXAMPLE_POD})
    assert status == 200, body
    assert [(c["provider"], c["offer_id"]) for c in body["candidates"]] == [
        ("onprem", cheap), ("vastai", "1002"), ("vastai", "1001")]
    node = body["candidates"][0]
    assert node["matched"]["vram"] == 24576 and node["matched"]["ram"] == 131072 and node["price_per_hour"] == 0.3
    skipped = body["explanation"]["providers"]["onprem"]["skipped"]
    reasons = " | ".join(skipped.values())
    assert len(skipped) == 4 and "busy" in reasons and "qualification" in reasons and "not healthy" in reasons
    assert "state is 'pending'" in reasons


async def test_providers_subset_and_unconfigured_is_reported(api, tmp_path):
    status, _, body = await api.call("POST", "/v1/selections", {"annotations": {"anex.sh/gpu-names": "RTX 4090"},
                                                                 "providers": ["runpod"], "limit": 2})
    assert status == 200
    assert {c["provider"] for c in body["candidates"]} == {"runpod"} and len(body["candidates"]) == 2
    assert set(body["explanation"]["providers"]) == {"runpod"}
    assert body["explanation"]["matched"] > 2 and body["explanation"]["returned"] == 2


@pytest.mark.parametrize("api", ["no-provider-keys"], indirect=True)
async def test_no_provider_keys_says_which_providers_are_not_configured_and_how(api):
    status, _, body = await api.call("POST", "/v1/selections", {"annotations": CURRENT_EXAMPLE_POD})
    assert status == 200 and body["candidates"] == []
    emptied = body["explanation"]["emptied_by"]
    assert "onprem had no offers: no on-prem node has joined this coordinator" in emptied
    assert "vastai is not configured on this coordinator: set ANEX_VASTAI_API_KEY (or ANEX_VASTAI_API_KEY_FILE" \
        in emptied
    assert "runpod is not configured on this coordinator: set ANEX_RUNPOD_API_KEY (or ANEX_RUNPOD_API_KEY_FILE" \
        in emptied
    providers = body["explanation"]["providers"]
    assert providers["vastai"]["configured"] is False and providers["runpod"]["configured"] is False
    assert providers["onprem"] == {"offers": 0}
    status, _, body = await api.call("GET", "/v1/offers")
    assert status == 200 and body["offers"] == [] and "ANEX_RUNPOD_API_KEY" in body["providers"]["runpod"]["error"]


async def test_offers_inspection(api):
    status, _, body = await api.call("GET", "/v1/offers?provider=vastai&limit=3")
    assert status == 200
    assert [o["offer_id"] for o in body["offers"]] == ["1003", "1002", "1004"]  # unverified shown too, cheapest first
    assert body["offers"][0]["specs"]["compute_cap"] == "8.9" and body["offers"][0]["specs"]["verified"] is False
    status, ctype, body = await api.call("GET", "/v1/offers?provider=aws")
    assert status == 400 and body["errors"][0]["field"] == "provider"
    status, _, body = await api.call("GET", "/v1/offers?limit=0")
    assert status == 400


async def test_nothing_left_says_which_filters_emptied_the_list(api):
    # CUDA 12.10 cannot be sent to Vast.AI (cuda_max_good is a float): filtered locally
    pod = {**CURRENT_EXAMPLE_POD, "anex.sh/cuda-min": "12.10"}
    status, _, body = await api.call("POST", "/v1/selections", {"annotations": pod, "providers": ["vastai"]})
    assert status == 200 and body["candidates"] == []
    assert body["explanation"]["emptied_by"] == "cuda"
    assert body["explanation"]["blocking"] == [{"filter": "cuda", "would_match_without": 2}]


async def test_nothing_from_the_provider_names_the_filters_its_api_applied(api):
    pod = {**CURRENT_EXAMPLE_POD, "anex.sh/price-max": "0.10"}
    status, _, body = await api.call("POST", "/v1/selections", {"annotations": pod, "providers": ["vastai"]})
    assert status == 200 and body["candidates"] == []
    emptied = body["explanation"]["emptied_by"]
    assert emptied.startswith("vastai had no offers matching") and "price" in emptied and "region" in emptied


async def test_openapi_documents_the_selection_routes(api):
    status, _, doc = await api.call("GET", "/v1/openapi.json", token=None)
    assert status == 200
    for path in ("/v1/selections", "/v1/offers", "/v1/bans", "/v1/bans/{machine_id}", "/v1/provisioning-failures",
                 "/v1/nodes/{node_id}/labels", "/v1/nodes/{node_id}/labels/{key}"):
        assert path in doc["paths"], path
    labels = doc["paths"]["/v1/nodes/{node_id}/labels"]["patch"]
    assert {"200", "401", "404", "422"} <= set(labels["responses"])


async def test_an_unparsable_bound_beside_an_exact_value_is_ignored_and_explained(api):
    pod = {**CURRENT_EXAMPLE_POD, "anex.sh/gpu-count-min": "plenty", "anex.sh/gpu-count-max": "0"}
    status, _, body = await api.call("POST", "/v1/selections", {"annotations": pod})
    assert status == 200, body
    assert [c["offer_id"] for c in body["candidates"]] == ["1002", "1001"]
    assert {i["annotation"] for i in body["explanation"]["ignored"]} == {"anex.sh/gpu-count-min",
                                                                         "anex.sh/gpu-count-max"}


async def _pricey_onprem_node(api):
    return await api.onprem_node("dgx-pricey", labels={"price-per-hour": "1.20", "country": "CZ",
                                                       "download-mbps": "10000"}, telemetry=telemetry())


async def test_price_ordering_puts_a_pricier_onprem_node_after_cheaper_offers(api):
    node = await _pricey_onprem_node(api)
    _, _, body = await api.call("POST", "/v1/selections", {"annotations": CURRENT_EXAMPLE_POD})
    assert [c["offer_id"] for c in body["candidates"]] == ["1002", "1001", node]
    _, _, body = await api.call("POST", "/v1/selections",
                                {"annotations": {**CURRENT_EXAMPLE_POD, "anex.sh/ordering": "prefer-onprem"}})
    assert [c["offer_id"] for c in body["candidates"]] == [node, "1002", "1001"]
    assert body["explanation"]["ordering"].startswith("prefer-onprem:")


@pytest.mark.parametrize("api", ["prefer-onprem"], indirect=True)  # the coordinator's ANEX_SELECTION_ORDERING
async def test_coordinator_setting_prefer_onprem(api):
    node = await _pricey_onprem_node(api)
    _, _, body = await api.call("POST", "/v1/selections", {"annotations": CURRENT_EXAMPLE_POD})
    assert [c["offer_id"] for c in body["candidates"]] == [node, "1002", "1001"]
    _, _, body = await api.call("POST", "/v1/selections",
                                {"annotations": {**CURRENT_EXAMPLE_POD, "anex.sh/ordering": "price"}})
    assert [c["offer_id"] for c in body["candidates"]] == ["1002", "1001", node]
