"""Heartbeat intake: cheap in the request, batched into the database.

Contract:
* :meth:`HeartbeatBuffer.record` only updates a dict (the latest heartbeat per node
  wins); the request is answered at once.
* :meth:`HeartbeatBuffer.flush` writes everything recorded so far in ONE transaction;
  :meth:`run` flushes every ``interval`` seconds and the coordinator flushes once more on
  clean shutdown, so an acknowledged heartbeat is lost only if the process is killed
  within ``interval`` of it. A failed flush puts its batch back (newer heartbeats win).
* On SQLite (3.33 or newer) a flush is ONE statement over the batch as a JSON array
  (``json_each``; a batch over :data:`SQLITE_BATCH_ROWS` rows is several, in the same
  transaction), so the writer thread leaves the interpreter's lock once per statement.
  ``executemany`` takes it back after every row, and while the event loop is busy each
  take waits up to the switch interval: on two cores, with the loop busy, executemany
  committed 5,500 to 7,500 rows of a 150,000-node table in 8 s (about 1 ms a row), while
  one statement per flush committed every row offered (22,000). The rows written are the
  same either way; PostgreSQL (asyncpg, on the loop) uses executemany.
* Telemetry arrives validated as :class:`anex_agent.telemetry.models.Telemetry` and is stored as
  the node sent it (latest JSON per node); the node's health is taken from
  ``telemetry.health.verdict`` (and ``.reasons``) when it is one this version knows, else left as is.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3

from anex_agent.coordinator.db import Database
from anex_agent.telemetry.models import Telemetry
from anex_agent.wire.heartbeat import Heartbeat

log = logging.getLogger(__name__)

_FLUSH_SQL = """
UPDATE nodes SET last_heartbeat_at = $2, status = $3, telemetry = COALESCE($4, telemetry),
       health = COALESCE($5, health), health_reasons = COALESCE($6, health_reasons), state = 'ready'
 WHERE id = $1
"""

# the same update, the batch as one JSON array of rows [id, at, status, telemetry, health, reasons]
_FLUSH_SQLITE_BATCH = """
UPDATE nodes SET last_heartbeat_at = beat.at, status = beat.status, telemetry = COALESCE(beat.telemetry, nodes.telemetry),
       health = COALESCE(beat.health, nodes.health), health_reasons = COALESCE(beat.reasons, nodes.health_reasons),
       state = 'ready'
  FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS at,
               json_extract(value, '$[2]') AS status, json_extract(value, '$[3]') AS telemetry,
               json_extract(value, '$[4]') AS health, json_extract(value, '$[5]') AS reasons
          FROM json_each($1)) AS beat
 WHERE nodes.id = beat.id
"""
#: UPDATE ... FROM came with SQLite 3.33
SQLITE_BATCH_UPDATE = sqlite3.sqlite_version_info >= (3, 33, 0)
#: rows per statement: a batch that grew while the database was slow (up to the whole fleet,
#: 8 KB of telemetry a row) is written in statements of this many rows, one transaction,
#: so its JSON text stays a few MB instead of a copy of the whole batch
SQLITE_BATCH_ROWS = 2000


def health_of(telemetry: Telemetry | None) -> tuple[str | None, list[str] | None]:
    """``(verdict, reasons)`` from telemetry, ``(None, None)`` when it carries no valid verdict."""
    return (None, None) if telemetry is None else telemetry.verdict()


class HeartbeatBuffer:
    def __init__(self, db: Database) -> None:
        self._db = db
        self._pending: dict[str, tuple] = {}
        self._writing: dict[str, tuple] = {}  # the batch a flush is committing right now
        self.latest: dict[str, float] = {}  # node id -> time of its newest heartbeat seen here
        self.flushed_total = 0
        self._flush_lock = asyncio.Lock()
        self._one_statement = db.dialect == "sqlite" and SQLITE_BATCH_UPDATE

    def record(self, node_id: str, heartbeat: Heartbeat, now: float) -> None:
        verdict, reasons = health_of(heartbeat.telemetry)
        self._pending[node_id] = (
            node_id,
            now,
            heartbeat.status.model_dump_json(),
            heartbeat.telemetry.as_sent_json() if heartbeat.telemetry is not None else None,
            verdict,
            json.dumps(reasons) if reasons is not None else None,
        )
        self.latest[node_id] = now

    def pending_for(self, node_id: str) -> tuple | None:
        """The newest heartbeat of ``node_id`` not yet committed (also while a flush writes it)."""
        return self._pending.get(node_id) or self._writing.get(node_id)

    def forget(self, node_id: str) -> None:
        self._pending.pop(node_id, None)
        self.latest.pop(node_id, None)

    async def flush(self) -> int:
        """Commit every heartbeat recorded before this call; return how many rows were written.

        Flushes are serialised: a caller that arrives while another flush is writing waits
        for it, so a read after ``await flush()`` never misses a batch still in flight.
        """
        async with self._flush_lock:
            if not self._pending:
                return 0
            batch, self._pending = self._pending, {}
            self._writing = batch
            try:
                # rows in node id order, as every multi-row writer takes them: two coordinators'
                # flushes of overlapping nodes wait for each other instead of deadlocking (PostgreSQL)
                rows = [batch[node_id] for node_id in sorted(batch)]
                if self._one_statement:
                    async with self._db.transaction() as tx:
                        for start in range(0, len(rows), SQLITE_BATCH_ROWS):
                            await tx.execute(_FLUSH_SQLITE_BATCH, json.dumps(rows[start:start + SQLITE_BATCH_ROWS]))
                else:
                    await self._db.executemany(_FLUSH_SQL, rows)
            except BaseException:
                for node_id, row in batch.items():
                    self._pending.setdefault(node_id, row)
                raise
            finally:
                self._writing = {}
            self.flushed_total += len(batch)
            return len(batch)

    async def run(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.flush()
            except Exception:
                log.exception("writing heartbeats failed; will retry")
