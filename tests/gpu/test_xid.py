"""XID events through the fake NVML event set: thread, classification, stop."""

from __future__ import annotations

import time

import pynvml as real_pynvml
import pytest

from anex_agent.gpu.inventory import read_inventory
from anex_agent.gpu.nvml import Nvml
from anex_agent.gpu.xid import XidLog, XidWatcher, classify_xid


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68])
def test_application_xids(xid):
    assert classify_xid(xid) == "application"


@pytest.mark.parametrize("xid", [48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119])
def test_other_xids_are_hardware(xid):
    assert classify_xid(xid) == "hardware"


def start_watcher(fake, xid_log):
    nvml = Nvml()
    assert nvml.ensure_ready()
    inventory, handles, _ = read_inventory(nvml)
    watcher = XidWatcher(nvml, handles, {g.uuid: g.index for g in inventory.gpus}, xid_log, timeout_ms=50)
    assert watcher.start(), watcher.error
    return nvml, watcher


def test_events_are_recorded_per_gpu_and_classified(fake):
    xid_log = XidLog()
    _, watcher = start_watcher(fake, xid_log)
    try:
        assert watcher.registered == [0, 1]
        fake.push_xid(1, 79)
        fake.push_xid(0, 13)
        fake.push_xid(1, 79)
        assert wait_for(lambda: len(xid_log.recent()) == 3)
    finally:
        watcher.stop()
    assert xid_log.last_xid(1) == 79 and xid_log.last_xid(0) == 13
    assert xid_log.hardware_xids() == {1: [79, 79]}
    assert xid_log.counts() == {(1, "GPU-bbbb", 79, "hardware"): 2, (0, "GPU-aaaa", 13, "application"): 1}
    assert [e.kind for e in xid_log.recent()] == ["hardware", "application", "hardware"]


def test_stop_returns_promptly_and_frees_the_event_set(fake):
    _, watcher = start_watcher(fake, XidLog())
    assert watcher.running
    started = time.monotonic()
    watcher.stop(timeout=5)
    assert not watcher.running
    assert time.monotonic() - started < 5
    assert len(fake.freed_sets) == 1


def test_wait_failure_ends_the_thread_without_raising(fake, caplog):
    xid_log = XidLog()
    _, watcher = start_watcher(fake, xid_log)
    fake.fail_all = real_pynvml.NVML_ERROR_GPU_IS_LOST
    assert wait_for(lambda: not watcher.running)
    assert "XID event wait failed" in (watcher.error or "")
    watcher.stop()


def test_gpus_without_event_support_are_skipped(install_fake):
    from anex_agent.testing.fake_nvml import FakeGpu

    fake = install_fake([FakeGpu(uuid="GPU-x", errors={"nvmlDeviceRegisterEvents": real_pynvml.NVML_ERROR_NOT_SUPPORTED})])
    nvml = Nvml()
    assert nvml.ensure_ready()
    inventory, handles, _ = read_inventory(nvml)
    watcher = XidWatcher(nvml, handles, {"GPU-x": 0}, XidLog(), timeout_ms=50)
    assert watcher.start() is False
    assert watcher.error == "no GPU supports XID events"
    assert len(fake.freed_sets) == 1


def test_a_lost_gpu_does_not_stop_xid_watching_of_the_others(install_fake):
    from anex_agent.testing.fake_nvml import FakeGpu

    fake = install_fake([
        FakeGpu(uuid="GPU-lost", bus_id="00000000:07:00.0",
                errors={"nvmlDeviceRegisterEvents": real_pynvml.NVML_ERROR_GPU_IS_LOST}),
        FakeGpu(uuid="GPU-ok", bus_id="00000000:0F:00.0"),
    ])
    nvml = Nvml()
    assert nvml.ensure_ready()
    inventory, handles, _ = read_inventory(nvml)
    xid_log = XidLog()
    watcher = XidWatcher(nvml, handles, {g.uuid: g.index for g in inventory.gpus}, xid_log, timeout_ms=50)
    try:
        assert watcher.start(), watcher.error
        assert watcher.registered == [1]
        fake.push_xid(1, 79)
        assert wait_for(lambda: xid_log.hardware_xids() == {1: [79]})
    finally:
        watcher.stop()
    assert len(fake.freed_sets) == 1


def test_nvml_failing_while_registering_frees_the_event_set(install_fake):
    from anex_agent.testing.fake_nvml import FakeGpu

    fake = install_fake([FakeGpu(uuid="GPU-x", errors={
        "nvmlDeviceRegisterEvents": real_pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH})])
    nvml = Nvml()
    assert nvml.ensure_ready()
    inventory, handles, _ = read_inventory(nvml)
    watcher = XidWatcher(nvml, handles, {"GPU-x": 0}, XidLog(), timeout_ms=50)
    assert watcher.start() is False
    assert "cannot watch XID events" in watcher.error
    assert len(fake.freed_sets) == 1
