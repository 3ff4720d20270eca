"""The heartbeat flush: on SQLite one statement over the batch, writing exactly what one
UPDATE per row writes (SQLite and PostgreSQL)."""

from __future__ import annotations

import json

import pytest

from anex_agent.wire.heartbeat import Heartbeat
from anex_agent.coordinator import heartbeats

from .conftest import start_harness, stop_harness

COLUMNS = "id, last_heartbeat_at, status, telemetry, health, health_reasons, state"

BEATS = [
    # telemetry with a verdict and reasons, text outside ASCII and quotes in it
    {"status": {"engine": "wireguard-go", "path": "udp", "path_reason": 'blocked "UDP" → websocket ✓'},
     "telemetry": {"hostname": "gpu-ß-1", "health": {"verdict": "degraded", "reasons": ["xid 79 on GPU 0"]},
                   "gpus": [{"index": 0, "util_pct": 87.5}]}},
    # no telemetry: the stored block and health are kept as they were
    {"status": {"engine": "userspace", "path": "websocket"}},
    # a verdict this version does not know: the health is left as is
    {"status": {}, "telemetry": {"health": {"verdict": "sparkly"}, "custom": {"nested": [1, 2.25, None, True]}}},
]


@pytest.fixture
async def coord(tmp_path, database_url, clock):
    """A coordinator whose heartbeats only these tests flush: its own flush every 0.1 s would take
    a batch a test records and then flushes itself (that flush would find nothing to write)."""
    harness = await start_harness(tmp_path, database_url, clock, heartbeat_flush_interval=0)
    try:
        yield harness
    finally:
        await stop_harness(harness)


async def _rows(coord) -> list[dict]:
    return await coord.ctx.db.fetch(f"SELECT {COLUMNS} FROM nodes ORDER BY name")


async def _beat_all(coord, at: float) -> int:
    buffer = coord.ctx.heartbeats
    ids = [row["id"] for row in await coord.ctx.db.fetch("SELECT id FROM nodes ORDER BY name")]
    for node_id, beat in zip(ids, BEATS):
        buffer.record(node_id, Heartbeat.model_validate_json(json.dumps(beat), strict=True), at)
    return await buffer.flush()


async def test_one_statement_writes_what_one_update_per_row_writes(coord):
    for i in range(len(BEATS)):
        await coord.join(f"n{i}")
    buffer = coord.ctx.heartbeats
    assert buffer._one_statement is (coord.ctx.db.dialect == "sqlite" and heartbeats.SQLITE_BATCH_UPDATE)

    # the first round through the path the database uses, the second one row at a time
    assert await _beat_all(coord, 1_790_000_000.123456) == len(BEATS)
    batched = await _rows(coord)
    buffer._one_statement = False
    assert await _beat_all(coord, 1_790_000_000.123456) == len(BEATS)
    assert await _rows(coord) == batched

    first, second, third = batched
    assert first["state"] == "ready" and first["last_heartbeat_at"] == 1_790_000_000.123456
    assert first["health"] == "degraded" and json.loads(first["health_reasons"]) == ["xid 79 on GPU 0"]
    assert json.loads(first["status"])["path_reason"] == 'blocked "UDP" → websocket ✓'
    assert json.loads(first["telemetry"])["hostname"] == "gpu-ß-1"
    assert second["telemetry"] is None and second["health"] == "unknown"
    assert json.loads(third["telemetry"])["custom"] == {"nested": [1, 2.25, None, True]}
    assert third["health"] == "unknown"


async def test_a_batch_larger_than_one_statement_is_written_whole(coord, monkeypatch):
    monkeypatch.setattr(heartbeats, "SQLITE_BATCH_ROWS", 2)  # three statements for five rows
    for i in range(5):
        await coord.join(f"n{i}")
    buffer = coord.ctx.heartbeats
    ids = [row["id"] for row in await coord.ctx.db.fetch("SELECT id FROM nodes ORDER BY name")]
    for i, node_id in enumerate(ids):
        buffer.record(node_id, Heartbeat.model_validate_json(json.dumps(BEATS[0]), strict=True), 100.0 + i)
    assert await buffer.flush() == 5
    rows = await _rows(coord)
    assert [row["last_heartbeat_at"] for row in rows] == [100.0, 101.0, 102.0, 103.0, 104.0]
    assert {row["state"] for row in rows} == {"ready"} and {row["health"] for row in rows} == {"degraded"}


async def test_a_flush_keeps_the_telemetry_a_later_beat_without_one_does_not_replace(coord):
    await coord.join("n0")
    buffer = coord.ctx.heartbeats
    (node_id,) = [row["id"] for row in await coord.ctx.db.fetch("SELECT id FROM nodes")]
    buffer.record(node_id, Heartbeat.model_validate_json(json.dumps(BEATS[0]), strict=True), 10.0)
    await buffer.flush()
    buffer.record(node_id, Heartbeat.model_validate_json(json.dumps(BEATS[1]), strict=True), 20.0)
    assert await buffer.flush() == 1
    (row,) = await _rows(coord)
    assert row["last_heartbeat_at"] == 20.0 and json.loads(row["status"])["path"] == "websocket"
    assert json.loads(row["telemetry"])["hostname"] == "gpu-ß-1" and row["health"] == "degraded"


async def test_a_flush_writes_its_rows_in_node_id_order():
    """Every multi-row writer of nodes takes the rows in node id order, so two coordinators'
    flushes of overlapping nodes wait for each other on PostgreSQL instead of deadlocking."""
    written: list[list[tuple]] = []

    class Recording:
        dialect = "postgresql"

        async def executemany(self, sql, rows):
            written.append(list(rows))

    buffer = heartbeats.HeartbeatBuffer(Recording())
    for node_id in ("n-3", "n-1", "n-2"):  # recorded out of order
        buffer.record(node_id, Heartbeat(), now=1.0)
    assert await buffer.flush() == 3
    assert [row[0] for row in written[0]] == ["n-1", "n-2", "n-3"]
