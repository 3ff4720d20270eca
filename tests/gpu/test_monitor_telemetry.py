"""TelemetryMonitor end to end (fake NVML and the real no-driver path) and the heartbeat block."""

from __future__ import annotations

import asyncio
import json
import logging
import sys

import pynvml as real_pynvml
import pytest

from anex_agent.gpu.monitor import TelemetryMonitor
from anex_agent.wire.heartbeat import Heartbeat

from anex_agent.testing.fake_nvml import FakeGpu
from .test_nvml import no_library
from .test_xid import wait_for


@pytest.fixture
def monitor(tmp_path):
    mon = TelemetryMonitor(state_dir=str(tmp_path), hostname="node-a", xid_timeout_ms=50)
    yield mon
    mon.close()


@no_library
def test_no_driver_node_real_pynvml(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", real_pynvml)
    mon = TelemetryMonitor(state_dir=str(tmp_path), hostname="cpu-node")
    try:
        snapshot = mon.collect()
        block = mon.telemetry()
    finally:
        mon.close()
    assert snapshot.nvml.state.value == "no_driver"
    assert block["nvml"]["state"] == "no_driver" and block["nvml"]["code"] == 12
    assert block["gpus"] == [] and block["inventory"]["gpu_count"] == 0
    assert block["health"]["verdict"] == "degraded"
    assert "no NVIDIA driver" in block["health"]["reasons"][0]
    assert block["host"]["cpu_count"] >= 1
    json.dumps(block)
    Heartbeat(telemetry=block)  # fits the wire model


def test_telemetry_block_shape_and_json(fake, monitor):
    monitor.qualification = {"v": 1, "status": "pass", "checks": []}
    monitor.collect()
    block = json.loads(json.dumps(monitor.telemetry()))
    assert set(block) >= {"v", "taken_at", "hostname", "health", "nvml", "inventory", "gpus", "xids", "host",
                          "qualification"}
    assert block["health"] == {"verdict": "healthy", "reasons": []}
    assert block["nvml"]["state"] == "ok"
    assert block["inventory"]["gpu_count"] == 2
    assert [g["uuid"] for g in block["gpus"]] == ["GPU-aaaa", "GPU-bbbb"]
    assert block["gpus"][0]["state"] == "ok" and block["gpus"][0]["gpu_util_pct"] == 37
    assert block["qualification"]["status"] == "pass"
    Heartbeat(telemetry=block)


def test_hardware_xid_makes_node_unhealthy(fake, monitor):
    monitor.collect()
    fake.push_xid(1, 79)
    fake.push_xid(0, 31)
    assert wait_for(lambda: len(monitor.xid_log.recent()) == 2)
    snapshot = monitor.collect()
    block = monitor.telemetry()
    assert snapshot.verdict.verdict == "unhealthy"
    assert block["health"]["reasons"] == ["GPU 1: hardware XID 79 (needs a GPU reset or reboot)"]
    assert block["gpus"][1]["last_xid"] == 79 and block["gpus"][1]["xid_counts"] == {"79": 1}
    assert block["gpus"][0]["last_xid"] == 31
    assert [x["kind"] for x in block["xids"]] == ["hardware", "application"]


def test_driver_update_under_running_node(fake, monitor, caplog):
    monitor.collect()
    fake.fail_all = real_pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH
    with caplog.at_level(logging.WARNING):
        for _ in range(20):
            snapshot = monitor.collect()
    assert snapshot.nvml.state.value == "version_mismatch"
    assert snapshot.verdict.verdict == "unhealthy"
    assert "reboot" in snapshot.verdict.reasons[0]
    assert snapshot.samples == {} and snapshot.inventory is None
    mismatch_logs = [r for r in caplog.records if "version_mismatch" in r.getMessage()]
    assert len(mismatch_logs) == 1  # logged once, not per sample


def test_lost_gpu_mid_run(fake, monitor, caplog):
    monitor.collect()
    fake.gpus[1].errors["nvmlDeviceGetUtilizationRates"] = real_pynvml.NVML_ERROR_GPU_IS_LOST
    with caplog.at_level(logging.WARNING):
        for _ in range(10):
            snapshot = monitor.collect()
    assert sum("GPU 1 (GPU-bbbb): gpu lost" in r.getMessage() for r in caplog.records) == 1
    block = monitor.telemetry()
    assert snapshot.gpu_failures == {1: "gpu_lost"}
    assert block["gpus"][1]["state"] == "gpu_lost" and "gpu_util_pct" not in block["gpus"][1]
    assert block["health"]["verdict"] == "unhealthy"


async def test_run_samples_off_the_loop_and_stops_on_cancel(fake, tmp_path):
    mon = TelemetryMonitor(state_dir=str(tmp_path), interval=0.01, xid_timeout_ms=50)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(mon.run(), name="gpu-telemetry")
        for _ in range(500):
            await asyncio.sleep(0.01)
            if mon.snapshot() is not None and fake.calls.get("nvmlDeviceGetUtilizationRates", 0) >= 4:
                break
        task.cancel()
    assert mon.snapshot() is not None
    assert fake.calls["nvmlDeviceGetUtilizationRates"] >= 4
    assert fake.init_calls == 1  # initialised once
    assert fake.initialised == 0  # run() shut NVML down when cancelled


def test_snapshot_and_telemetry_never_call_nvml(fake, monitor):
    assert monitor.snapshot() is None and monitor.telemetry() is None
    monitor.collect()
    before = sum(fake.calls.values())
    for _ in range(10):
        monitor.telemetry()
        monitor.snapshot()
    assert sum(fake.calls.values()) == before


def test_monitor_survives_unexpected_errors(install_fake, tmp_path, caplog):
    fake = install_fake([FakeGpu()])

    def broken(handle):
        raise RuntimeError("boom")

    fake.module.nvmlDeviceGetUtilizationRates = broken
    mon = TelemetryMonitor(state_dir=str(tmp_path), watch_xids=False)
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            snapshot = mon.collect()
    mon.close()
    assert snapshot.host is not None
    assert sum("boom" in r.getMessage() for r in caplog.records) == 1


def test_onprem_monitor_sends_its_qualification(fake, tmp_path):
    mon = TelemetryMonitor(state_dir=str(tmp_path), watch_xids=False, qualify=True)
    mon.collect()
    mon.collect()
    block = mon.telemetry()
    mon.close()
    qualification = block["qualification"]
    checks = {c["id"]: c for c in qualification["checks"]}
    assert checks["gpu_model"]["status"] == "pass" and checks["gpu_model"]["measured"] == "2 x NVIDIA A100-SXM4-40GB"
    assert qualification["summary"]["gpu_count"] == 2
    assert fake.init_calls == 1  # qualification reuses the monitor's NVML


def _typed(value):
    """``value`` with every leaf paired with its type (``1 == 1.0`` but ``(int, 1) != (float, 1.0)``)."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return (type(value).__name__, value)


def _unknown_keys(model, path="telemetry"):
    """Every key of ``model`` (at any depth) that the Telemetry model does not declare."""
    from pydantic import BaseModel

    found = [f"{path}.{key}" for key in (model.model_extra or {})]
    for name in type(model).model_fields:
        value = getattr(model, name)
        items = value if isinstance(value, list) else [value]
        for index, item in enumerate(items):
            if isinstance(item, BaseModel):
                found += _unknown_keys(item, f"{path}.{name}" + (f".{index}" if isinstance(value, list) else ""))
    return found


def test_the_built_block_is_the_wire_model_field_for_field(fake, monitor, tmp_path):
    """What gpu/telemetry.py builds and what anex_agent.telemetry.models.Telemetry declares stay in step."""
    from anex_agent.gpu.qualify import Check, Qualification
    from anex_agent.wire.telemetry import parse_telemetry

    monitor.qualification = Qualification((Check("tpm", "required", "pass", "2.0", "2.0"),), summary={"nvme_count": 2}).to_dict()
    monitor.collect()
    fake.push_xid(1, 79)
    assert wait_for(lambda: len(monitor.xid_log.recent()) == 1)
    monitor.collect()
    monitor.collect()  # a second sample: host rates (…_bps) appear
    block = json.loads(json.dumps(monitor.telemetry()))
    telemetry = parse_telemetry(block)
    assert _unknown_keys(telemetry) == []
    assert _typed(telemetry.as_sent()) == _typed(block)  # as sent: an integer stays an integer
    assert telemetry.gpus[1].xid_counts == {"79": 1} and telemetry.xids[0].kind == "hardware"
    assert telemetry.qualification.status == "pass" and telemetry.verdict()[0] == "unhealthy"
