"""Fleet GPU metrics on a real coordinator (SQLite, and PostgreSQL when configured): heartbeats carrying
real telemetry blocks (agent monitor over the fake pynvml, and the no-driver path) show up on /metrics
with DCGM names, GPU labels and a node label."""

from __future__ import annotations

import asyncio
import json
import sys

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from anex_agent.wire.heartbeat import Heartbeat
from anex_agent.wire.nodes import Health
from anex_agent.coordinator.routes import fleet_metrics as telemetry_metrics
from anex_agent.gpu.monitor import TelemetryMonitor

from .conftest import start_harness, stop_harness

from anex_agent.testing.fake_nvml import FakeGpu, FakeNvml


@pytest.fixture
async def fast_coord(monkeypatch, tmp_path, database_url, clock):
    monkeypatch.setattr(telemetry_metrics, "REFRESH_INTERVAL", 0.05)
    harness = await start_harness(tmp_path, database_url, clock)
    try:
        yield harness
    finally:
        await stop_harness(harness)


def block_from(monkeypatch, tmp_path, fake: FakeNvml, hostname: str, xid: int | None = None) -> dict:
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    mon = TelemetryMonitor(state_dir=str(tmp_path), hostname=hostname, watch_xids=False)
    try:
        mon.collect()
        if xid is not None:
            from anex_agent.gpu.xid import XidEvent, classify_xid

            mon.xid_log.record(XidEvent(gpu=0, uuid=fake.gpus[0].uuid, xid=xid, kind=classify_xid(xid), at=0.0))
            mon.collect()
        return mon.telemetry()
    finally:
        mon.close()


async def scrape(coord, predicate, timeout=10.0) -> dict:
    deadline = asyncio.get_running_loop().time() + timeout
    async with aiohttp.ClientSession() as session:
        while True:
            async with session.get(coord.url + "/metrics",
                                   headers={"Authorization": f"Bearer {coord.ctx.admin_token}"}) as response:
                text = await response.text()
            families = {f.name: f for f in text_string_to_metric_families(text)}
            if predicate(families) or asyncio.get_running_loop().time() > deadline:
                return families
            await asyncio.sleep(0.05)


async def test_fleet_metrics_carry_dcgm_names_gpu_labels_and_node(fast_coord, monkeypatch, tmp_path):
    gpu_fake = FakeNvml([FakeGpu(uuid="GPU-a0", bus_id="00000000:07:00.0"),
                         FakeGpu(uuid="GPU-a1", bus_id="00000000:0F:00.0", util=(88, 5))])
    gpu_block = block_from(monkeypatch, tmp_path, gpu_fake, "host-a", xid=79)
    broken_driver = FakeNvml([])
    broken_driver.init_error = 12  # NVML_ERROR_LIBRARY_NOT_FOUND
    cpu_block = block_from(monkeypatch, tmp_path, broken_driver, "host-b")

    a, joined_a, _ = await fast_coord.join("gpu-a", provider="onprem")
    b, joined_b, _ = await fast_coord.join("cpu-b")
    c, joined_c, _ = await fast_coord.join("odd-c")
    await a.heartbeat(joined_a.node_id, Heartbeat(telemetry=gpu_block))
    await b.heartbeat(joined_b.node_id, Heartbeat(telemetry=cpu_block))
    # a block not of the model's shape is refused on intake (422, test_strict_input); one stored
    # by an older coordinator may still be in the table: it must not break the scrape of the others
    odd = {"gpus": "not a list", "inventory": 3, "health": {"verdict": "healthy", "reasons": []}}
    with pytest.raises(ValueError):
        Heartbeat(telemetry=odd)
    await fast_coord.ctx.db.execute("UPDATE nodes SET telemetry = $2, last_heartbeat_at = $3 WHERE id = $1",
                                    joined_c.node_id, json.dumps(odd), fast_coord.ctx.clock())

    families = await scrape(fast_coord, lambda f: f.get("anex_fleet_nodes_with_telemetry") is not None
                            and f["anex_fleet_nodes_with_telemetry"].samples[0].value == 3)
    assert families["anex_fleet_nodes_with_telemetry"].samples[0].value == 3
    util = {s.labels["UUID"]: s for s in families["DCGM_FI_DEV_GPU_UTIL"].samples}
    assert set(util) == {"GPU-a0", "GPU-a1"}
    assert util["GPU-a1"].value == 88
    assert util["GPU-a1"].labels == {"gpu": "1", "UUID": "GPU-a1", "pci_bus_id": "00000000:0F:00.0",
                                     "device": "nvidia1", "modelName": "NVIDIA A100-SXM4-40GB", "hostname": "host-a",
                                     "node": "gpu-a", "node_id": joined_a.node_id}
    assert {s.labels["node"] for s in families["DCGM_FI_DEV_FB_USED"].samples} == {"gpu-a"}
    xid = [s for s in families["DCGM_FI_DEV_XID_ERRORS"].samples if s.labels["gpu"] == "0"]
    assert xid[0].value == 79
    nvml_up = {s.labels["node"]: s.value for s in families["anex_nvml_up"].samples}
    assert nvml_up == {"gpu-a": 1, "cpu-b": 0}
    health = {(s.labels["node"], s.labels["verdict"]): s.value for s in families["anex_node_health"].samples}
    assert health[("gpu-a", "unhealthy")] == 1 and health[("cpu-b", "degraded")] == 1
    ages = {s.labels["node"] for s in families["anex_fleet_node_telemetry_age_seconds"].samples}
    assert ages == {"gpu-a", "cpu-b"}  # odd-c's block has no taken_at

    # the coordinator's own view of the same heartbeats
    node = await fast_coord.admin.get_node(joined_a.node_id)
    assert node.health == Health.unhealthy
    assert any("XID 79" in r for r in node.health_reasons)
    stored = await fast_coord.admin.get_telemetry(joined_a.node_id)
    assert stored.telemetry["inventory"]["gpu_count"] == 2
    assert (await fast_coord.admin.get_node(joined_b.node_id)).health == Health.degraded


async def test_refresh_failure_keeps_the_cache_and_logs_once(caplog):
    class FailingDb:
        calls = 0

        async def fetch(self, sql, *args):
            FailingDb.calls += 1
            raise RuntimeError("database away")

    clock = [0.0]
    fleet = telemetry_metrics.FleetTelemetry(FailingDb(), lambda: 0.0, monotonic=lambda: clock[0])
    fleet.nodes = {"n1": ("node-1", 0.0, '{"v": 1, "hostname": "h", "taken_at": 0.0, "gpus": []}')}
    for _ in range(5):
        await fleet.ensure_fresh()  # what every authorised scrape awaits
        clock[0] += telemetry_metrics.REFRESH_INTERVAL
    assert FailingDb.calls >= 5
    assert "n1" in fleet.nodes
    assert sum("database away" in r.getMessage() for r in caplog.records) == 1
    names = {f.name for f in text_string_to_metric_families(telemetry_metrics.exposition(fleet).decode())}
    assert {"anex_nvml_up", "anex_fleet_nodes_with_telemetry"} <= names


async def test_the_cache_is_refreshed_by_scrapes_only_and_at_most_once_per_interval():
    """Nobody scrapes: nothing is read. Scrapes close together share one refresh."""
    class CountingDb:
        calls = 0

        async def fetch(self, sql, *args):
            CountingDb.calls += 1
            return []

    clock = [100.0]
    fleet = telemetry_metrics.FleetTelemetry(CountingDb(), lambda: 0.0, monotonic=lambda: clock[0])
    await asyncio.sleep(0.05)
    assert CountingDb.calls == 0  # no timer reads the table
    await asyncio.gather(*(fleet.ensure_fresh() for _ in range(5)))  # five scrapes at once: one refresh
    assert CountingDb.calls == 1
    clock[0] += telemetry_metrics.REFRESH_INTERVAL / 2
    await fleet.ensure_fresh()
    assert CountingDb.calls == 1  # fresh enough
    clock[0] += telemetry_metrics.REFRESH_INTERVAL
    await fleet.ensure_fresh()
    assert CountingDb.calls == 2
