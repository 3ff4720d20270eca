"""The agent's wiring (agent/heartbeat.py start_telemetry + the API's registry) renders our metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from anex_agent.agent.heartbeat import start_telemetry, telemetry_block


async def test_agent_registry_serves_dcgm_metrics_and_heartbeat_block(fake, tmp_path):
    registry = CollectorRegistry(auto_describe=True)
    monitor = start_telemetry(str(tmp_path), registry)
    try:
        assert telemetry_block(monitor) is None  # nothing sampled yet
        await monitor.sample_once()
        families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
        block = telemetry_block(monitor)
    finally:
        monitor.close()
    assert len(families["DCGM_FI_DEV_GPU_UTIL"].samples) == 2
    assert block["health"]["verdict"] == "healthy" and block["inventory"]["gpu_count"] == 2
