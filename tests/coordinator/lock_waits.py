"""Seeing a transaction wait for another, to make a read-then-write race happen on purpose.

Contract: a test holds a transaction that wrote (or locked) a row, starts the code under test
as a task, and waits until :func:`another_waits` is true before it commits: the task then
read the row before the commit, or waits for a lock the held transaction has. On PostgreSQL
that is a backend of this test's own database waiting for a lock (``pg_stat_activity``; other
tests on the same server do not count); on SQLite the held transaction has the connection to
itself, so every other transaction waits (true at once).

Where the other side of the race must be real code too, :class:`PausedBefore` stops that code's
transaction before a statement of the test's choosing, until the test lets it go on.
"""

from __future__ import annotations

import asyncio
import contextlib

from anex_agent.coordinator.db import Database, SqliteDatabase


async def another_waits(db: Database) -> bool:
    """True once some transaction on ``db``'s database waits for a lock (see the module docstring)."""
    if isinstance(db, SqliteDatabase):
        return db._lock.locked()
    return bool(await db.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"))


class PausedBefore:
    """``db`` whose transactions stop before their first statement starting with ``prefix`` (``paused``
    is set then) until ``go`` is set; everything else passes through to ``db``."""

    def __init__(self, db: Database, prefix: str) -> None:
        self._db, self._prefix = db, prefix
        self.paused, self.go = asyncio.Event(), asyncio.Event()

    def __getattr__(self, name):
        return getattr(self._db, name)

    @contextlib.asynccontextmanager
    async def transaction(self):
        async with self._db.transaction() as tx:
            yield _PausedConn(self, tx)


class _PausedConn:
    def __init__(self, owner: PausedBefore, tx) -> None:
        self._owner, self._tx = owner, tx

    def __getattr__(self, name):
        return getattr(self._tx, name)

    async def execute(self, sql: str, *args):
        if sql.startswith(self._owner._prefix):
            self._owner.paused.set()
            await self._owner.go.wait()
        return await self._tx.execute(sql, *args)
