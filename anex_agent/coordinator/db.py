"""One async database layer for SQLite (default) and PostgreSQL.

Contract:
* SQL is written once, in PostgreSQL's placeholder style (``$1``, ``$2``, a
  placeholder may repeat); :func:`_to_sqlite` translates it to SQLite's numbered
  ``?1`` form in this one place. Write portable SQL: ``INSERT .. ON CONFLICT .. DO
  NOTHING RETURNING``, ``BIGINT``, ``DOUBLE PRECISION``, ``TEXT`` (JSON is stored as
  text). Flags are ``INTEGER`` 0/1.
* Rows come back as plain ``dict``.
* A read that guards a write in the same transaction (read a state, then move it) ends in
  ``FOR UPDATE``: PostgreSQL runs READ COMMITTED, so without it a concurrent transaction
  could change the row between the read and the write, and one of the two writes would be
  lost; with it the second reader waits for the first transaction to end and reads what it
  wrote. SQLite gives each transaction the whole database (``BEGIN IMMEDIATE``), and
  :func:`_to_sqlite` drops the clause.
* ``async with db.transaction() as tx:`` runs every statement on ``tx`` in one
  transaction: committed when the block ends, rolled back on any exception
  (including cancellation), so nothing is ever half-written.
* SQLite runs on one dedicated thread (the ``sqlite3`` module blocks); an
  ``asyncio.Lock`` gives each transaction the connection to itself. Writers are
  serialised, which is what SQLite does anyway. Reads outside a transaction
  (``db.fetch``/``fetchrow``/``fetchval``) use a second, read-only connection on its
  own thread (WAL mode: they neither wait for nor see uncommitted writes).
  PostgreSQL uses an asyncpg pool.
* ``await db.lock_in(tx, namespace, name)`` serialises transactions about something no row
  stands for yet, which ``FOR UPDATE`` cannot lock (a public key that neither ``nodes`` nor
  ``gateways`` holds: a node's join and a gateway's registration with one key). PostgreSQL:
  a transaction-level advisory lock on ``(namespace, hashtext(name))``, waited for and held
  until ``tx`` ends (a hash collision only makes two unrelated transactions wait for each
  other). SQLite: nothing to do.
* ``async with db.exclusive(key) as mine:`` is a cluster-wide try-lock (PostgreSQL: a
  session advisory lock on a connection held for the block); ``mine`` is False when
  another coordinator holds it. On SQLite (one coordinator per file) it is always True.
* :meth:`Database.listen` delivers PostgreSQL ``NOTIFY`` payloads of a channel
  (other coordinator processes' changes); on SQLite it is a no-op and the caller
  falls back to polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote

from anex_agent.errors import ConfigError
from anex_agent.host.private_file import ensure_private, tighten

log = logging.getLogger(__name__)

_PLACEHOLDER = re.compile(r"\$(\d+)")
_FOR_UPDATE = re.compile(r"\s+FOR\s+(NO\s+KEY\s+)?UPDATE(\s+OF\s+\w+)?(\s+(NOWAIT|SKIP\s+LOCKED))?\s*;?\s*$",
                         re.IGNORECASE)
_LOCKING_LEFT = re.compile(r"\bFOR\s+(NO\s+KEY\s+)?(UPDATE|SHARE)\b", re.IGNORECASE)
CONNECT_TIMEOUT = 10.0  # seconds to reach PostgreSQL before giving up (ConfigError at start)
WAL_AUTOCHECKPOINT = 10_000  # SQLite pages (4 KiB) of WAL before a checkpoint (SQLite's default: 1,000)


def _to_sqlite(sql: str) -> str:
    sql = _FOR_UPDATE.sub("", sql)
    if _LOCKING_LEFT.search(sql):  # SQLite has no row locks: only a trailing clause can be dropped
        raise ValueError(f"a locking clause SQLite cannot drop (only a trailing FOR UPDATE can): {sql!r}")
    return _PLACEHOLDER.sub(r"?\1", sql)


def _rowcount(status: str) -> int:
    """asyncpg returns a command tag like ``UPDATE 3``; the last word is the row count."""
    tail = status.rsplit(" ", 1)[-1]
    return int(tail) if tail.isdigit() else 0


class Conn(Protocol):
    """What a transaction (and the database itself) offers."""

    async def fetch(self, sql: str, *args: Any) -> list[dict]: ...
    async def fetchrow(self, sql: str, *args: Any) -> dict | None: ...
    async def fetchval(self, sql: str, *args: Any) -> Any: ...
    async def execute(self, sql: str, *args: Any) -> int: ...
    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...


class _RowReads:
    """``fetchrow``/``fetchval`` in terms of the subclass's ``fetch``."""

    async def fetch(self, sql: str, *args: Any) -> list[dict]:
        raise NotImplementedError

    async def fetchrow(self, sql: str, *args: Any) -> dict | None:
        rows = await self.fetch(sql, *args)
        return rows[0] if rows else None

    async def fetchval(self, sql: str, *args: Any) -> Any:
        row = await self.fetchrow(sql, *args)
        return next(iter(row.values())) if row else None


class Database(_RowReads):
    """Base class; use :func:`open_database`."""

    dialect: str = ""
    url: str = ""

    async def fetch(self, sql: str, *args: Any) -> list[dict]:
        async with self.transaction() as tx:
            return await tx.fetch(sql, *args)

    async def execute(self, sql: str, *args: Any) -> int:
        async with self.transaction() as tx:
            return await tx.execute(sql, *args)

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        async with self.transaction() as tx:
            await tx.executemany(sql, rows)

    def transaction(self) -> contextlib.AbstractAsyncContextManager[Conn]:
        raise NotImplementedError

    async def listen(self, channel: str, callback: Callable[[str], None]) -> bool:
        """Call ``callback(payload)`` for each NOTIFY on ``channel``; False where unsupported."""
        return False

    @contextlib.asynccontextmanager
    async def exclusive(self, key: int) -> AsyncIterator[bool]:
        """Whether this process holds the cluster-wide lock ``key`` for the block (see above)."""
        yield True

    def listening(self) -> bool:
        """Whether a :meth:`listen` connection is up (False where unsupported or lost)."""
        return False

    async def notify(self, tx: Conn, channel: str, payload: str) -> None:
        """Inside ``tx``: notify listeners of ``channel`` when the transaction commits."""

    async def lock_in(self, tx: Conn, namespace: int, name: str) -> None:
        """Inside ``tx``: wait for, and hold until ``tx`` ends, the lock on ``name`` (see above)."""

    async def close(self) -> None:
        raise NotImplementedError


# ---------------------------------------------------------------- SQLite


class _SqliteConn(_RowReads):
    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    async def fetch(self, sql: str, *args: Any) -> list[dict]:
        return await self._db._run(self._db._fetch_sync, _to_sqlite(sql), args)

    async def execute(self, sql: str, *args: Any) -> int:
        return await self._db._run(self._db._execute_sync, _to_sqlite(sql), args)

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        await self._db._run(self._db._executemany_sync, _to_sqlite(sql), rows)


class SqliteDatabase(Database):
    dialect = "sqlite"

    def __init__(self, path: str) -> None:
        self.url = f"sqlite:///{path}"
        self._path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite")
        self._lock = asyncio.Lock()
        self._conn: sqlite3.Connection | None = None
        # reads outside a transaction go to a second, read-only connection on its own
        # thread: in WAL mode they never wait for the writer and never see uncommitted rows
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-read")
        self._rconn: sqlite3.Connection | None = None

    async def open(self) -> None:
        await self._run(self._open_sync)
        if self._path != ":memory:":  # a second connection to :memory: would be another database
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._reader, self._open_reader_sync)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False, timeout=30)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA busy_timeout=30000")
        return conn

    def _open_sync(self) -> None:
        database = None if self._path == ":memory:" else Path(self._path)
        if database is not None:  # 0600, and with it the -wal and -shm SQLite creates beside it
            ensure_private(database)
        conn = self._connect()
        conn.execute("PRAGMA journal_mode=WAL")
        if database is not None:  # left 0644 by a version that did not make them private
            for suffix in ("-wal", "-shm"):
                tighten(database.with_name(database.name + suffix))
        conn.execute("PRAGMA synchronous=NORMAL")
        # checkpoint the WAL every 10,000 pages (40 MB), not 1,000: a heartbeat flush touches
        # about a page per node of a large fleet, and pages rewritten before the next
        # checkpoint are copied back once (150,000 nodes: about 25 % less time per flushed row)
        conn.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT}")
        conn.execute("PRAGMA foreign_keys=ON")
        self._conn = conn

    def _open_reader_sync(self) -> None:
        conn = self._connect()
        conn.execute("PRAGMA query_only=ON")
        self._rconn = conn

    def _read_sync(self, sql: str, args: Sequence[Any]) -> list[dict]:
        assert self._rconn is not None
        return [dict(row) for row in self._rconn.execute(sql, args).fetchall()]

    async def fetch(self, sql: str, *args: Any) -> list[dict]:
        """A read outside any transaction: sees every transaction committed before it."""
        if self._rconn is None:
            return await super().fetch(sql, *args)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._reader, self._read_sync, _to_sqlite(sql), args)

    async def _run(self, fn: Callable, *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn, *args)

    def _fetch_sync(self, sql: str, args: Sequence[Any]) -> list[dict]:
        assert self._conn is not None
        cur = self._conn.execute(sql, args)
        return [dict(row) for row in cur.fetchall()]

    def _execute_sync(self, sql: str, args: Sequence[Any]) -> int:
        assert self._conn is not None
        return self._conn.execute(sql, args).rowcount

    def _executemany_sync(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        assert self._conn is not None
        self._conn.executemany(sql, rows)

    def _script_sync(self, sql: str) -> None:
        assert self._conn is not None
        self._conn.execute(sql)

    def _end_sync(self, commit: bool) -> None:
        """Commit or roll back the open transaction, if any; a failed commit rolls back."""
        assert self._conn is not None
        if not self._conn.in_transaction:
            return
        if not commit:
            self._conn.execute("ROLLBACK")
            return
        try:
            self._conn.execute("COMMIT")
        except BaseException:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Conn]:
        # The thread runs jobs in order, so a rollback queued after a statement whose
        # caller was cancelled still runs after that statement. Shielded: a cancelled
        # caller must leave the connection clean for the next one.
        async with self._lock:
            try:
                await self._run(self._script_sync, "BEGIN IMMEDIATE")
                yield _SqliteConn(self)
            except BaseException:
                await asyncio.shield(self._run(self._end_sync, False))
                raise
            else:
                await asyncio.shield(self._run(self._end_sync, True))

    async def close(self) -> None:
        async with self._lock:
            if self._conn is not None:
                await self._run(self._conn.close)
                self._conn = None
        if self._rconn is not None:
            await asyncio.get_running_loop().run_in_executor(self._reader, self._rconn.close)
            self._rconn = None
        self._executor.shutdown(wait=True)
        self._reader.shutdown(wait=True)


# ---------------------------------------------------------------- PostgreSQL


class _PgConn:
    def __init__(self, conn: Any) -> None:
        self._conn = conn

    async def fetch(self, sql: str, *args: Any) -> list[dict]:
        return [dict(r) for r in await self._conn.fetch(sql, *args)]

    async def fetchrow(self, sql: str, *args: Any) -> dict | None:
        row = await self._conn.fetchrow(sql, *args)
        return dict(row) if row is not None else None

    async def fetchval(self, sql: str, *args: Any) -> Any:
        return await self._conn.fetchval(sql, *args)

    async def execute(self, sql: str, *args: Any) -> int:
        return _rowcount(await self._conn.execute(sql, *args))

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        await self._conn.executemany(sql, rows)


class PostgresDatabase(Database):
    dialect = "postgresql"

    def __init__(self, url: str, password: str | None = None) -> None:
        self.url = url
        self._password = password  # None: asyncpg takes the URL's, $PGPASSWORD or the passfile ($PGPASSFILE)
        self._pool: Any = None
        self._listen_conn: Any = None

    async def open(self) -> None:
        import asyncpg  # imported lazily: SQLite users need no PostgreSQL driver loaded

        try:
            self._pool = await asyncpg.create_pool(self.url, password=self._password, min_size=1, max_size=10, timeout=CONNECT_TIMEOUT)
        except (OSError, asyncio.TimeoutError, asyncpg.PostgresError) as err:
            raise ConfigError("--database", f"cannot connect to PostgreSQL at {_redact(self.url)}: {err}") from None

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Conn]:
        async with self._pool.acquire() as conn:
            async with conn.transaction():
                yield _PgConn(conn)

    async def fetch(self, sql: str, *args: Any) -> list[dict]:
        async with self._pool.acquire() as conn:
            return [dict(r) for r in await conn.fetch(sql, *args)]

    @contextlib.asynccontextmanager
    async def exclusive(self, key: int) -> AsyncIterator[bool]:
        async with self._pool.acquire() as conn:
            mine = await conn.fetchval("SELECT pg_try_advisory_lock($1)", key)
            try:
                yield bool(mine)
            finally:
                if mine:
                    await conn.execute("SELECT pg_advisory_unlock($1)", key)

    async def listen(self, channel: str, callback: Callable[[str], None]) -> bool:
        import asyncpg

        if self._listen_conn is not None:
            with contextlib.suppress(Exception):
                await self._listen_conn.close()
        self._listen_conn = await asyncpg.connect(self.url, password=self._password, timeout=CONNECT_TIMEOUT)
        await self._listen_conn.add_listener(channel, lambda _c, _pid, _ch, payload: callback(payload))
        return True

    def listening(self) -> bool:
        return self._listen_conn is not None and not self._listen_conn.is_closed()

    async def notify(self, tx: Conn, channel: str, payload: str) -> None:
        await tx.execute("SELECT pg_notify($1, $2)", channel, payload)

    async def lock_in(self, tx: Conn, namespace: int, name: str) -> None:
        await tx.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", namespace, name)

    async def close(self) -> None:
        if self._listen_conn is not None:
            with contextlib.suppress(Exception):
                await self._listen_conn.close()
            self._listen_conn = None
        if self._pool is not None:
            await self._pool.close()
            self._pool = None


def _userinfo_end(url: str) -> tuple[int, int]:
    """``(start, end)`` of the user info of ``scheme://userinfo@host...``, or ``(-1, -1)`` without one.

    The user info runs to the LAST ``@`` of the URL, so a password holding ``@`` or ``/``
    (unencoded) stays whole; a URL whose query holds an ``@`` is over-redacted, never
    under-redacted.
    """
    scheme_end = url.find("://")
    at = url.rfind("@")
    if scheme_end < 0 or at < scheme_end or url.startswith("/", scheme_end + 3):  # sqlite:///PATH: no authority
        return -1, -1
    return scheme_end + 3, at


def split_password(url: str) -> tuple[str, str | None]:
    """``(url without its password, the password percent-decoded)``; ``(url, None)`` when it has none.

    ``postgresql://u:pa/ss@w@host/db`` gives ``("postgresql://u@host/db", "pa/ss@w")``;
    ``postgresql://u:p%40ss@host/db`` gives ``("postgresql://u@host/db", "p@ss")``.
    """
    start, end = _userinfo_end(url)
    if start < 0:
        return url, None
    user, sep, password = url[start:end].partition(":")
    if not sep:
        return url, None
    return f"{url[:start]}{user}{url[end:]}", unquote(password)


def _redact(url: str) -> str:
    """``url`` with its password replaced by ``***`` (see :func:`_userinfo_end` for where it ends)."""
    start, end = _userinfo_end(url)
    if start < 0:
        return url
    user, sep, _ = url[start:end].partition(":")
    return f"{url[:start]}{user}:***{url[end:]}" if sep else url


async def open_database(url: str, *, password: str | None = None) -> Database:
    """Open ``sqlite:///PATH`` (or a bare path) or ``postgresql://...``.

    ``password`` (PostgreSQL) wins over one in the URL; a password in the URL is taken out
    of it here (:func:`split_password`), so it may hold ``@`` or ``/`` and never reaches a log.

    Raises ConfigError naming ``--database`` for an unknown scheme or an unreachable server.
    """
    if url.startswith(("postgresql://", "postgres://")):
        bare, in_url = split_password(url)
        db: Database = PostgresDatabase(bare, password if password is not None else in_url)
    elif url.startswith("sqlite:///") or "://" not in url:
        path = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else url
        if path != ":memory:":
            parent = Path(path).parent
            if not parent.is_dir():
                raise ConfigError("--database", f"directory {parent} of the SQLite file does not exist")
        db = SqliteDatabase(path)
    else:
        raise ConfigError("--database", "must be sqlite:///PATH, a file path, or postgresql://USER:PASS@HOST/DB")
    try:
        await db.open()  # type: ignore[attr-defined]
    except OSError as err:  # creating the SQLite file 0600 (a PostgreSQL failure is its own error)
        raise ConfigError("--database", f"cannot create the SQLite file {err.filename}: {err.strerror}") from None
    return db
