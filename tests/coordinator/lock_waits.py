"""Seeing a transaction wait for another, to make a read-then-write race happen on purpose.

Contract: a test holds a transaction that wrote (or locked) a row, starts the code under test
as a task, and waits until :func:`another_waits` is true before it commits: the task then
read the row before the commit, or waits for a lock the held transaction has. On PostgreSQL
that is a backend of this test's own database waiting for a lock (``pg_stat_activity``; other
tests on the same server do not count); on SQLite the held transaction has the connection to
itself, so every other transaction waits (true at once).
"""

from __future__ import annotations

from anex_agent.coordinator.db import Database, SqliteDatabase


async def another_waits(db: Database) -> bool:
    """True once some transaction on ``db``'s database waits for a lock (see the module docstring)."""
    if isinstance(db, SqliteDatabase):
        return db._lock.locked()
    return bool(await db.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"))
