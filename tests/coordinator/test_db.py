"""The storage layer: one SQL dialect for both databases, transactions that never half-write, migrations."""

from __future__ import annotations

import asyncio

import pytest

from anex_agent.coordinator import db as dbmod
from anex_agent.coordinator.migrations import CORE, Migration, apply
from anex_agent.errors import ConfigError
from tests.coordinator.lock_waits import another_waits
from tests.polling import wait_until


@pytest.fixture
async def db(database_url):
    database = await dbmod.open_database(database_url)
    try:
        yield database
    finally:
        await database.close()


def test_placeholders_are_translated_once():
    assert dbmod._to_sqlite("SELECT $1, $2, $1 WHERE x = $10") == "SELECT ?1, ?2, ?1 WHERE x = ?10"
    assert dbmod._to_sqlite("SELECT s FROM t WHERE id = $1 FOR UPDATE") == "SELECT s FROM t WHERE id = ?1"
    for clause in ("FOR UPDATE;", "for update", "FOR NO KEY UPDATE", "FOR UPDATE OF t", "FOR UPDATE NOWAIT",
                   "FOR UPDATE SKIP LOCKED", "FOR NO KEY UPDATE OF t SKIP LOCKED ;"):
        assert dbmod._to_sqlite(f"SELECT s FROM t WHERE id = $1 {clause}") == "SELECT s FROM t WHERE id = ?1", clause
    for kept in ("SELECT s FROM t WHERE id IN (SELECT id FROM u FOR UPDATE)", "SELECT s FROM t FOR SHARE"):
        with pytest.raises(ValueError, match="locking clause"):  # SQLite would fail on it at run time
            dbmod._to_sqlite(kept)
    assert dbmod._rowcount("UPDATE 3") == 3 and dbmod._rowcount("CREATE TABLE") == 0


async def test_unknown_scheme_and_missing_directory_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="--database"):
        await dbmod.open_database("mysql://x/y")
    with pytest.raises(ConfigError, match="does not exist"):
        await dbmod.open_database(f"sqlite:///{tmp_path}/missing/dir/x.db")


async def test_repeated_placeholders_and_rowcounts(db):
    await db.execute("CREATE TABLE t (a TEXT PRIMARY KEY, b BIGINT)")
    await db.executemany("INSERT INTO t (a, b) VALUES ($1, $2)", [("x", 1), ("y", 2), ("z", 3)])
    assert await db.fetchval("SELECT COUNT(*) FROM t WHERE b >= $1 AND a <> $2 AND b <> $1", 1, "z") == 1
    assert await db.execute("UPDATE t SET b = b + 1 WHERE b >= $1", 2) == 2
    assert await db.fetchrow("SELECT a, b FROM t WHERE a = $1", "nope") is None


async def test_an_error_or_a_cancellation_rolls_the_whole_transaction_back(db):
    await db.execute("CREATE TABLE t (a TEXT PRIMARY KEY)")
    with pytest.raises(ZeroDivisionError):
        async with db.transaction() as tx:
            await tx.execute("INSERT INTO t (a) VALUES ('one')")
            1 / 0
    started = asyncio.Event()

    async def slow_writer():
        async with db.transaction() as tx:
            await tx.execute("INSERT INTO t (a) VALUES ('two')")
            started.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(slow_writer())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await db.fetch("SELECT a FROM t") == []
    async with db.transaction() as tx:  # the connection is usable afterwards
        await tx.execute("INSERT INTO t (a) VALUES ('three')")
    assert [r["a"] for r in await db.fetch("SELECT a FROM t")] == ["three"]


async def test_migrations_run_once_in_order_and_extensions_join(db):
    extra = [Migration(101, "ext b", "CREATE TABLE ext_b (x TEXT)"), Migration(100, "ext a", "CREATE TABLE ext_a (x TEXT)")]
    core = [m.number for m in CORE]
    assert core == list(range(1, len(CORE) + 1))
    assert await apply(db, [*CORE, *extra]) == [*core, 100, 101]
    assert await apply(db, [*CORE, *extra]) == []
    rows = await db.fetch("SELECT number FROM schema_migrations ORDER BY number")
    assert [r["number"] for r in rows] == [*core, 100, 101]
    with pytest.raises(ValueError, match="duplicate"):
        await apply(db, [*CORE, Migration(1, "clash", "SELECT 1")])


async def test_a_failing_migration_leaves_nothing_and_is_retried(db):
    bad = Migration(150, "half", "CREATE TABLE half_a (x TEXT); CREATE TABLE half_a (x TEXT)")
    with pytest.raises(Exception):
        await apply(db, [*CORE, bad])
    tables = await db.fetch("SELECT number FROM schema_migrations")
    assert 150 not in [r["number"] for r in tables]
    good = Migration(150, "fixed", "CREATE TABLE half_a (x TEXT)")
    assert await apply(db, [*CORE, good]) == [150]


async def test_concurrent_starts_apply_each_migration_once(database_url):
    first, second = await dbmod.open_database(database_url), await dbmod.open_database(database_url)
    try:
        results = await asyncio.gather(apply(first, CORE), apply(second, CORE))
        assert sorted(results[0] + results[1]) == [m.number for m in CORE]
    finally:
        await first.close()
        await second.close()


async def test_cancelled_while_beginning_leaves_no_open_transaction(db):
    await db.execute("CREATE TABLE t (a TEXT PRIMARY KEY)")
    for _ in range(20):  # cancel at varying points of BEGIN
        async def writer():
            async with db.transaction() as tx:
                await tx.execute("INSERT INTO t (a) VALUES ('x')")
                await asyncio.sleep(10)

        task = asyncio.create_task(writer())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    async with db.transaction() as tx:
        await tx.execute("INSERT INTO t (a) VALUES ('y')")
    assert [r["a"] for r in await db.fetch("SELECT a FROM t")] == ["y"]


@pytest.mark.parametrize("url,shown", [
    ("postgresql://anex:s3cret@db.example:5432/anex", "postgresql://anex:***@db.example:5432/anex"),
    ("postgresql://anex:p@ss@word@db.example/anex", "postgresql://anex:***@db.example/anex"),
    ("postgresql://db.example/anex", "postgresql://db.example/anex"),
    ("postgresql://u:pa/ss@w@host/db", "postgresql://u:***@host/db"),
    ("postgresql://u:p%40ss@host/db", "postgresql://u:***@host/db"),
    ("postgresql://u:a/b/c@host:5432/db?sslmode=require", "postgresql://u:***@host:5432/db?sslmode=require"),
    ("postgresql://u@host/db", "postgresql://u@host/db"),
    ("sqlite:////tmp/a:b@c.db", "sqlite:////tmp/a:b@c.db"),
])
def test_logged_database_urls_hide_the_whole_password(url, shown):
    from anex_agent.coordinator.db import _redact

    assert _redact(url) == shown


@pytest.mark.parametrize("url,bare,password", [
    ("postgresql://u:pa/ss@w@host/db", "postgresql://u@host/db", "pa/ss@w"),
    ("postgresql://u:p%40ss@host/db", "postgresql://u@host/db", "p@ss"),
    ("postgresql://u:@host/db", "postgresql://u@host/db", ""),
    ("postgresql://u@host:5432/db", "postgresql://u@host:5432/db", None),
    ("postgresql://host/db", "postgresql://host/db", None),
    ("sqlite:///tmp/x.db", "sqlite:///tmp/x.db", None),
    ("sqlite:////tmp/a:b@c.db", "sqlite:////tmp/a:b@c.db", None),
])
def test_password_is_taken_out_of_the_url(url, bare, password):
    from anex_agent.coordinator.db import split_password

    assert split_password(url) == (bare, password)


async def test_sqlite_files_are_private_in_a_directory_others_may_read(tmp_path):
    import os
    import stat

    directory = tmp_path / "shared"
    directory.mkdir()
    os.chmod(directory, 0o755)
    old_umask = os.umask(0o022)  # what a manual start from a shell has (systemd's UMask=0077 would hide it)
    try:
        db = await dbmod.open_database(f"sqlite:///{directory}/coordinator.db")
        try:
            await db.execute("CREATE TABLE t (a TEXT)")
            await db.execute("INSERT INTO t VALUES ($1)", "x")
            assert sorted(p.name for p in directory.iterdir()) == ["coordinator.db", "coordinator.db-shm",
                                                                  "coordinator.db-wal"]
            for path in directory.iterdir():
                assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        finally:
            await db.close()
        for path in directory.iterdir():  # left readable by an older version: made private at the next start
            os.chmod(path, 0o644)
        db = await dbmod.open_database(f"sqlite:///{directory}/coordinator.db")
        try:
            for path in directory.iterdir():
                assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        finally:
            await db.close()
    finally:
        os.umask(old_umask)


async def test_a_read_for_update_waits_for_the_transaction_that_holds_the_row(db):
    """Two compare-and-sets of one row (a provisioning step, a DELETE): the second reader waits
    for the first transaction and reads what it wrote, so neither write is lost. PostgreSQL (READ
    COMMITTED) needs the ``FOR UPDATE``; SQLite serialises transactions and drops the clause."""
    await db.execute("CREATE TABLE t (id TEXT PRIMARY KEY, state TEXT)")
    await db.execute("INSERT INTO t (id, state) VALUES ($1, $2)", "p", "renting")
    read_by_second: list[str] = []

    async def second() -> None:  # the DELETE: deleting, whatever the state it finds
        async with db.transaction() as tx:
            read_by_second.append(await tx.fetchval("SELECT state FROM t WHERE id = $1 FOR UPDATE", "p"))
            await tx.execute("UPDATE t SET state = $2 WHERE id = $1", "p", "deleting")

    async with db.transaction() as tx:  # the step: booting, only from renting
        assert await tx.fetchval("SELECT state FROM t WHERE id = $1 FOR UPDATE", "p") == "renting"
        task = asyncio.create_task(second())
        await wait_until(lambda: _second_is_waiting(db, read_by_second), what="the second transaction to wait or read")
        await tx.execute("UPDATE t SET state = $2 WHERE id = $1", "p", "booting")
    await task
    assert read_by_second == ["booting"]  # it waited, and saw the step's write
    assert await db.fetchval("SELECT state FROM t WHERE id = $1", "p") == "deleting"


async def _second_is_waiting(db, read_by_second: list[str]) -> bool:
    """True once the second transaction read the row (the bug) or waits for its lock."""
    return bool(read_by_second) or await another_waits(db)


async def test_a_lock_on_a_name_is_held_until_the_transaction_ends(db):
    """``lock_in``: a second transaction locking the same name waits for the first to end (on
    SQLite every transaction waits for the one before it anyway)."""
    order: list[str] = []

    async def second() -> None:
        async with db.transaction() as tx:
            await db.lock_in(tx, 7, "a public key")
            order.append("second")

    async with db.transaction() as tx:
        await db.lock_in(tx, 7, "a public key")
        task = asyncio.create_task(second())
        await wait_until(lambda: another_waits(db), what="the second transaction to wait for the lock")
        order.append("first")
    await task
    assert order == ["first", "second"]
