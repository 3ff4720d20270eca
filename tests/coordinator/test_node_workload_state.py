"""The workload's container state from the heartbeat shows at GET /v1/nodes/{id}."""

from __future__ import annotations

from datetime import UTC, datetime

from anex_agent.wire.heartbeat import ContainerState, Heartbeat, TransportStatus


async def test_the_node_view_shows_the_workload_state_of_the_last_heartbeat(coord):
    client, joined, _ = await coord.join()
    started = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    running = ContainerState(state="running", started_at=started)
    beat = Heartbeat(status=TransportStatus(engine="kernel", workload=running),
                          config_version=joined.config.version)
    await client.heartbeat(joined.node_id, beat)
    view = await coord.admin.get_node(joined.node_id)
    assert view.status.workload == running
    oom = ContainerState(state="terminated", reason="OOMKilled", exit_code=137, signal=9,
                              started_at=started, finished_at=datetime.now(UTC), restart_count=2)
    await client.heartbeat(joined.node_id, beat.model_copy(update={"status": beat.status.model_copy(update={"workload": oom})}))
    view = await coord.admin.get_node(joined.node_id)
    assert view.status.workload.reason == "OOMKilled" and view.status.workload.restart_count == 2
    await client.heartbeat(joined.node_id, Heartbeat(config_version=joined.config.version))  # a daemon
    assert (await coord.admin.get_node(joined.node_id)).status.workload is None
