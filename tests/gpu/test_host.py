"""Host metrics from the real psutil on this machine."""

from __future__ import annotations

import os

from anex_agent.gpu.host import HostSampler, block_device_of


def test_host_sample_has_the_documented_fields(tmp_path):
    sampler = HostSampler(str(tmp_path))
    first = sampler.sample()
    (tmp_path / "f").write_bytes(b"x" * 100_000)
    second = sampler.sample()
    assert first["cpu_count"] == os.cpu_count()
    assert 0 <= second["cpu_util_pct"] <= 100
    assert second["mem_total_bytes"] > second["mem_available_bytes"] > 0
    assert second["disk"]["path"] == str(tmp_path)
    assert second["disk"]["total_bytes"] >= second["disk"]["free_bytes"] > 0
    assert {"load1", "load5", "load15"} <= set(second)
    assert second["net"]["rx_bytes"] >= 0 and "rx_bps" in second["net"] and "rx_bps" not in first["net"]
    if "read_bytes" in second["disk"]:
        assert "read_bps" in second["disk"] and second["disk"]["write_bytes"] >= first["disk"]["write_bytes"]


def test_block_device_resolution():
    device = block_device_of("/")
    st = os.stat("/")
    if os.major(st.st_dev) == 0:
        assert device is None  # overlay/tmpfs root: no block device
    else:
        assert device and os.path.exists(f"/sys/class/block/{device}")
    assert block_device_of("/nonexistent/path") is None
