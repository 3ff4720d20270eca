"""Provider clients against local HTTP servers shaped like Vast.AI and RunPod."""

from __future__ import annotations

import logging

import pytest
from aiohttp.test_utils import TestServer

from anex_agent.selection.annotations import parse_annotations
from anex_agent.selection.filters import apply_filters
from anex_agent.selection.offers import OfferTable
from anex_agent.providers.offers_http import HttpPolicy, JsonClient, ProviderError, retry_after_seconds
from anex_agent.providers.runpod.offers import RunPodConfig, RunPodSource, country_of_datacenter, offers_from_answer
from anex_agent.providers.vastai.offers import VastAIConfig, VastAISource, offer_from_api
from anex_agent.selection.service import select
from tests.selection.fake_providers import VAST_OFFERS, FakeProvider, runpod_data
from tests.selection.test_doc_examples import CURRENT_EXAMPLE_POD, LEGACY_EXAMPLE_POD

FAST = HttpPolicy(timeout=2.0, attempts=3, backoff=0.01, max_backoff=0.02, cache_ttl=30.0)


class Sleeps:
    def __init__(self):
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def fake():
    provider = FakeProvider()
    provider.runpod_data = runpod_data()
    server = TestServer(provider.app(), host="127.0.0.1")
    await server.start_server()
    provider.base = str(server.make_url("/api/v0"))
    provider.graphql_url = str(server.make_url("/graphql"))
    try:
        yield provider
    finally:
        await server.close()


def vast(fake, *, key=None, policy=FAST, sleep=None, clock=None) -> VastAISource:
    client = JsonClient("vastai", policy=policy, sleep=sleep or Sleeps(), clock=clock or Clock())
    return VastAISource(VastAIConfig(api_key=fake.api_key if key is None else key, base_url=fake.base, policy=policy),
                        client)


def runpod(fake, *, sleep=None) -> RunPodSource:
    client = JsonClient("runpod", policy=FAST, sleep=sleep or Sleeps(), clock=Clock())
    return RunPodSource(RunPodConfig(api_key=fake.api_key, url=fake.graphql_url, policy=FAST), client)


def test_vast_units_are_normalized():
    o = offer_from_api(VAST_OFFERS[1])
    assert (o.compute_cap, o.vram_mb, o.ram_mb, o.price, o.download_mbps) == (860.0, 24576.0, 32768.0, 0.61, 1000.0)
    assert (o.machine_id, o.offer_id, o.country, o.verified, o.datacenter) == ("502", "1002", "DE", True, True)
    assert o.cuda == 12002000.0  # cuda_max_good 12.2


async def test_vast_request_carries_the_filters_the_api_can_apply(fake):
    source = vast(fake)
    try:
        table = await source.offers(parse_annotations(CURRENT_EXAMPLE_POD))
    finally:
        await source.aclose()
    [request] = fake.requests
    q = request["query"]
    assert request["auth"] == "Bearer secret-key-123"
    assert q["num_gpus"] == {"eq": 2} and q["gpu_ram"] == {"gte": 20480.0} and q["cpu_ram"] == {"gte": 32768.0}
    assert q["cpu_cores_effective"] == {"gte": 8.0} and q["dph_total"] == {"lte": 1.5}
    assert q["inet_down"] == {"gte": 1000.0}
    assert q["verified"] == {"eq": True} and q["datacenter"] == {"eq": True}
    assert q["gpu_name"] == {"in": ["RTX 4090", "RTX 3090"]} and "CZ" in q["geolocation"]["in"]
    assert "US" not in q["geolocation"]["in"]
    assert {o.offer_id for o in table.offers} == {"1001", "1002"}


@pytest.mark.parametrize("pod", [CURRENT_EXAMPLE_POD, LEGACY_EXAMPLE_POD], ids=["current", "legacy"])
async def test_select_example_pod_through_vast(fake, pod):
    source = vast(fake)
    try:
        s = await select(pod, [source])
    finally:
        await source.aclose()
    assert [c["offer_id"] for c in s.candidates] == ["1002", "1001"]  # cheapest first
    assert s.candidates[0]["machine_id"] == "502" and s.candidates[0]["price_per_hour"] == 0.61
    assert s.explanation["providers"]["vastai"]["offers"] == 2
    assert "price" in s.explanation["providers"]["vastai"]["applied_by_provider"]


async def test_api_narrowing_agrees_with_local_filtering(fake):
    """The API narrowing is only an optimization: all raw offers filtered locally give the same ranking."""
    from anex_agent.selection.offers import OfferTable
    from anex_agent.selection.service import choose

    filters = parse_annotations(CURRENT_EXAMPLE_POD)
    source = vast(fake)
    try:
        narrowed = choose(await source.offers(filters), filters)
    finally:
        await source.aclose()
    everything = choose(OfferTable([offer_from_api(o) for o in VAST_OFFERS]), filters)
    assert everything.explanation["offers_considered"] == len(VAST_OFFERS)
    assert [c["offer_id"] for c in narrowed.candidates] == [c["offer_id"] for c in everything.candidates]


async def test_rate_limit_429_honours_retry_after(fake):
    fake.script = [(429, {"Retry-After": "3"}, 0), (503, {}, 0)]
    sleeps = Sleeps()
    source = vast(fake, sleep=sleeps)
    try:
        table = await source.offers(parse_annotations({}))
    finally:
        await source.aclose()
    assert len(fake.requests) == 3 and len(table) > 0
    assert sleeps.calls[0] == 3.0  # Retry-After seconds
    ceiling = min(FAST.max_backoff, FAST.backoff * 2)  # the second attempt's: anex_agent.backoff's equal jitter
    assert ceiling / 2 <= sleeps.calls[1] <= ceiling  # after the 503


async def test_persistent_5xx_gives_a_retryable_error_after_the_attempts(fake):
    fake.script = [(500, {}, 0)] * 5
    source = vast(fake)
    with pytest.raises(ProviderError) as info:
        try:
            await source.offers(parse_annotations({}))
        finally:
            await source.aclose()
    assert info.value.retryable and info.value.status == 500
    assert len(fake.requests) == FAST.attempts


async def test_bad_key_is_not_retried_and_not_logged(fake, caplog):
    caplog.set_level(logging.DEBUG)
    source = vast(fake, key="wrong-key-456")
    with pytest.raises(ProviderError) as info:
        try:
            await source.offers(parse_annotations({}))
        finally:
            await source.aclose()
    assert info.value.status == 401 and not info.value.retryable
    assert len(fake.requests) == 1
    assert "wrong-key-456" not in caplog.text and "wrong-key-456" not in str(info.value)
    assert "wrong-key-456" not in repr(source.config)


async def test_timeout_is_retryable(fake):
    policy = HttpPolicy(timeout=0.2, attempts=2, backoff=0.01, max_backoff=0.01)
    fake.script = [(200, {}, 1.0), (200, {}, 1.0)]
    source = vast(fake, policy=policy)
    with pytest.raises(ProviderError) as info:
        try:
            await source.offers(parse_annotations({}))
        finally:
            await source.aclose()
    assert info.value.retryable and "timed out" in str(info.value)


async def test_cache_serves_a_burst_and_expires(fake):
    clock = Clock()
    source = vast(fake, clock=clock)
    filters = parse_annotations(CURRENT_EXAMPLE_POD)
    try:
        import asyncio
        await asyncio.gather(*(source.offers(filters) for _ in range(5)))  # concurrent burst: one call
        await source.offers(filters)
        assert len(fake.requests) == 1
        clock.now += FAST.cache_ttl + 1
        await source.offers(filters)
        assert len(fake.requests) == 2
    finally:
        await source.aclose()


def test_retry_after_http_date():
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", 1445412470.0) == pytest.approx(10.0)
    assert retry_after_seconds("5", 0) == 5.0
    assert retry_after_seconds("soon", 0) is None


async def test_runpod_offers_per_type_datacenter_and_tier(fake):
    source = runpod(fake)
    try:
        table = await source.offers(parse_annotations({"anex.sh/gpu-count": "2"}))
    finally:
        await source.aclose()
    [request] = fake.requests
    assert request["body"]["variables"] == {"gpuCount": 2} and "gpuTypes" in request["body"]["query"]
    ids = {o.offer_id for o in table.offers}
    assert ids == {
        "NVIDIA GeForce RTX 4090@EU-RO-1/SECURE/x2", "NVIDIA GeForce RTX 4090@EU-RO-1/COMMUNITY/x2",
        "NVIDIA H100 80GB HBM3@EU-RO-1/SECURE/x2",
        "NVIDIA GeForce RTX 4090@US-CA-2/SECURE/x2", "NVIDIA GeForce RTX 4090@US-CA-2/COMMUNITY/x2",
        "NVIDIA GeForce RTX 3090@US-CA-2/SECURE/x2", "NVIDIA GeForce RTX 3090@US-CA-2/COMMUNITY/x2",
    }
    o = next(o for o in table.offers if o.offer_id == "NVIDIA GeForce RTX 4090@EU-RO-1/SECURE/x2")
    assert (o.price, o.vram_mb, o.vram_total_mb, o.country, o.machine_id) == (1.38, 24576.0, 49152.0, "RO", None)
    assert (o.cpu_cores, o.ram_mb) == (16.0, 62.0 * 1024)


async def test_runpod_selection_cloud_type_datacenters_and_gpu_priority(fake):
    source = runpod(fake)
    pod = {"anex.sh/gpu-names": "RTX 4090,RTX 3090", "anex.sh/gpu-count": "2",
           "runpod.anex.sh/cloud-type": "SECURE", "runpod.anex.sh/datacenter-ids": "US-CA-2,EU-RO-1",
           "runpod.anex.sh/keep-gpu-type-priority": "true"}
    try:
        s = await select(pod, [source])
    finally:
        await source.aclose()
    assert [c["offer_id"] for c in s.candidates] == [
        "NVIDIA GeForce RTX 4090@US-CA-2/SECURE/x2", "NVIDIA GeForce RTX 4090@EU-RO-1/SECURE/x2",
        "NVIDIA GeForce RTX 3090@US-CA-2/SECURE/x2"]
    assert all(c["cloud_type"] == "SECURE" and c["machine_id"] is None for c in s.candidates)


async def test_runpod_graphql_errors(fake):
    fake.graphql_errors = [{"message": "Something went wrong"}]
    source = runpod(fake)
    with pytest.raises(ProviderError) as info:
        try:
            await source.offers(parse_annotations({}))
        finally:
            await source.aclose()
    assert "Something went wrong" in str(info.value)


async def test_one_provider_failing_does_not_stop_the_others(fake):
    fake.fail_path = "/graphql"  # RunPod answers 502 every time
    sources = [vast(fake), runpod(fake)]
    try:
        s = await select({"anex.sh/gpu-names": "RTX 4090"}, sources)
    finally:
        for source in sources:
            await source.aclose()
    report = s.explanation["providers"]
    assert report["runpod"]["offers"] == 0 and report["runpod"]["retryable"] is True
    assert "502" in report["runpod"]["error"]
    assert report["vastai"]["offers"] == 3
    assert [c["provider"] for c in s.candidates] == ["vastai"] * 3  # Vast.AI's offers are still ranked


# Every shape of RunPod data center id: <region>-<country>-<n> (2, 3 or 4-letter region),
# <country>-<state>-<n> (US), <country>-<city>-<n> (CA), and degenerate forms.
RUNPOD_DATACENTER_SHAPES = [
    ("EU-RO-1", "RO"), ("EU-SE-1", "SE"), ("EU-NL-1", "NL"), ("EU-CZ-1", "CZ"), ("EU-FR-1", "FR"),
    ("EUR-IS-1", "IS"), ("EUR-IS-2", "IS"), ("EUR-IS-3", "IS"), ("EUR-NO-1", "NO"),
    ("AP-JP-1", "JP"), ("OC-AU-1", "AU"), ("SEA-SG-1", "SG"), ("APAC-IN-1", "IN"),
    ("US-CA-2", "US"), ("US-GA-1", "US"), ("US-KS-2", "US"), ("US-TX-3", "US"), ("US-IL-1", "US"),
    ("US-WA-1", "US"), ("US-DE-1", "US"), ("US-NC-1", "US"), ("US-OR-1", "US"),
    ("CA-MTL-1", "CA"), ("CA-MTL-3", "CA"), ("eur-no-1", "NO"), (" EU-RO-1 ", "RO"), ("EU-RO", "RO"),
    ("JP-1", "JP"), ("X", None), ("", None), ("EUR-1", None), ("EUR-XX-1", None), ("ZZ-QQ-1", None), ("1", None),
]


@pytest.mark.parametrize("dc,code", RUNPOD_DATACENTER_SHAPES)
def test_runpod_datacenter_country(dc, code):
    assert country_of_datacenter(dc) == code


@pytest.mark.parametrize("dc,region", [("EUR-IS-1", "europe"), ("EUR-NO-1", "europe"), ("SEA-SG-1", "asia-pacific"),
                                       ("US-DE-1", "north-america"), ("CA-MTL-1", "north-america")])
def test_runpod_offers_of_every_datacenter_shape_match_their_region(dc, region):
    data = runpod_data()
    data["dataCenters"] = [{"id": dc, "name": dc, "location": "", "gpuAvailability": [
        {"gpuTypeId": "NVIDIA GeForce RTX 4090", "stockStatus": "High", "available": True}]}]
    table_ = OfferTable(offers_from_answer(data, 1))
    assert len(apply_filters(table_, parse_annotations({"anex.sh/region": region})).rows) == 2  # both tiers
    other = "oceania" if region != "oceania" else "europe"
    assert apply_filters(table_, parse_annotations({"anex.sh/region": other})).rows == []


async def test_waiters_recover_when_the_caller_making_the_request_is_cancelled(fake):
    import asyncio

    fake.script = [(200, {}, 0.5)]  # the first request is slow
    source = vast(fake)
    filters = parse_annotations({})
    try:
        first = asyncio.create_task(source.offers(filters), name="test-first")
        await asyncio.sleep(0.1)
        second = asyncio.create_task(source.offers(filters), name="test-second")
        await asyncio.sleep(0.1)
        first.cancel()
        table = await second
        assert len(table) > 0 and first.cancelled()
    finally:
        await source.aclose()


async def test_tables_are_built_and_chosen_off_the_event_loop(fake, monkeypatch):
    """Decoding answers, building tables, joining and choosing run on the selection thread only."""
    import threading

    from anex_agent.selection import jsonpieces, service
    from anex_agent.providers.onprem import OnpremSource
    from tests.selection.test_onprem_bans_purity import node

    threads: dict[str, set[str]] = {}

    def spy(name, real):
        def wrapper(*args, **kwargs):
            threads.setdefault(name, set()).add(threading.current_thread().name)
            return real(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(OfferTable, "__init__", spy("table", OfferTable.__init__))
    monkeypatch.setattr(OfferTable, "concat", classmethod(spy("concat", OfferTable.concat.__func__)))
    monkeypatch.setattr(service, "choose", spy("choose", service.choose))
    monkeypatch.setattr("anex_agent.providers.offers_http.loads_in_pieces",
                        spy("decode", jsonpieces.loads_in_pieces))

    async def lister():
        return [node()]

    sources = [vast(fake), runpod(fake), OnpremSource(lister)]
    selection = await select(CURRENT_EXAMPLE_POD, sources)
    assert selection.candidates
    assert set(threads) == {"table", "concat", "choose", "decode"}
    assert all(name.startswith("anex-selection") for names in threads.values() for name in names), threads


async def test_expired_answers_are_evicted_and_freed_on_the_selection_thread(fake, monkeypatch):
    from anex_agent.selection import threads

    released: list[list] = []
    monkeypatch.setattr(threads, "release", lambda values: released.append(list(values)))
    clock = Clock()
    source = vast(fake, clock=clock)
    try:
        await source.offers(parse_annotations({"anex.sh/gpu-names": "RTX 4090"}))
        await source.offers(parse_annotations({"anex.sh/gpu-names": "RTX 3090"}))
        assert len(source.client._cache) == 2 and released == []
        clock.now += FAST.cache_ttl + 1
        await source.offers(parse_annotations({"anex.sh/gpu-names": "A100 SXM4"}))
        assert len(source.client._cache) == 1
        [dropped] = released
        assert len(dropped) == 2 and all(isinstance(t, OfferTable) for t in dropped)
    finally:
        await source.aclose()
    assert len(released) == 2 and len(released[1]) == 1  # closing hands over the rest
