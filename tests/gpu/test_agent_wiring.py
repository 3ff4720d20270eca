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
    assert block.health.verdict == "healthy" and block.inventory.gpu_count == 2


async def test_first_heartbeat_carries_telemetry(fake, tmp_path):
    """The heartbeat loop waits (bounded) for the first sample instead of sending an empty block."""
    import asyncio
    from types import SimpleNamespace

    from anex_agent.agent.heartbeat import heartbeat_loop
    from anex_agent.wire.heartbeat import HeartbeatAck, NodeState, TransportStatus

    beats = []
    first = asyncio.Event()

    async def heartbeat(node_id, beat):
        beats.append(beat)
        first.set()
        return HeartbeatAck(state=NodeState.ready, config_version=0, next_heartbeat_in=60)

    async def transport_status():
        return TransportStatus(engine="test")

    monitor = start_telemetry(str(tmp_path), CollectorRegistry(auto_describe=True))
    agent = SimpleNamespace(
        identity=SimpleNamespace(node_id="n-1"),
        dataplane=SimpleNamespace(transport_status=transport_status, config=None),
        link=SimpleNamespace(heartbeat=heartbeat),
        telemetry=monitor,
        workload=None,
        coordinator_reachable=True,
        note_reachable=lambda ok, why=None: None,
    )
    try:
        async with asyncio.TaskGroup() as tg:
            beating = tg.create_task(heartbeat_loop(agent), name="heartbeat")
            sampling = tg.create_task(monitor.run(), name="gpu-telemetry")
            await asyncio.wait_for(first.wait(), 10)
            beating.cancel()
            sampling.cancel()
    finally:
        monitor.close()
    assert beats[0].telemetry is not None and beats[0].telemetry.health.verdict == "healthy"
