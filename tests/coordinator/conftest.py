"""Fixtures: a real coordinator app on SQLite, and on PostgreSQL when ANEX_TEST_POSTGRES_URL is set.

Each PostgreSQL test gets its own freshly created database, dropped afterwards.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from anex_agent.wire import keys
from anex_agent.client.rest import CoordinatorClient
from anex_agent.coordinator.app import build_app
from anex_agent.coordinator.context import Coordinator
from anex_agent.coordinator.settings import Settings
from tests.sqlite_schema import migrated

POSTGRES_URL = os.environ.get("ANEX_TEST_POSTGRES_URL")

BACKENDS = [
    "sqlite",
    pytest.param(
        "postgresql",
        marks=[pytest.mark.postgres, pytest.mark.skipif(not POSTGRES_URL, reason="ANEX_TEST_POSTGRES_URL is not set")],
    ),
]


class FakeClock:
    """Injectable clock: starts at the real time, moves only when told."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _with_database(url: str, name: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{name}"


async def create_pg_database() -> tuple[str, str]:
    import asyncpg

    name = f"anex_t_{secrets.token_hex(6)}"
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return _with_database(POSTGRES_URL, name), name


async def drop_pg_database(name: str) -> None:
    """Drop a test database; FORCE ends our leftover connections. An autovacuum worker
    (another role) may briefly hold it, which a non-superuser cannot end: retry."""
    import asyncio

    import asyncpg

    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        for attempt in range(50):
            try:
                await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                return
            except (asyncpg.InsufficientPrivilegeError, asyncpg.ObjectInUseError):
                if attempt == 49:
                    raise
                await asyncio.sleep(0.1)
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def backend_url(backend: str, tmp_path: Path | None = None) -> AsyncIterator[str]:
    """A database URL for ``backend``: a SQLite file in ``tmp_path``, or a fresh PostgreSQL
    database dropped afterwards."""
    if backend == "sqlite":
        assert tmp_path is not None
        yield f"sqlite:///{tmp_path / 'coordinator.db'}"
        return
    url, name = await create_pg_database()
    try:
        yield url
    finally:
        await drop_pg_database(name)


@pytest.fixture(params=BACKENDS)
async def database_url(request, tmp_path: Path):
    async with backend_url(request.param, tmp_path) as url:
        yield url


class HookedWrites:
    """A database whose writes first await ``before()``: a transaction (how the heartbeat
    flush writes on SQLite) and ``executemany`` (on PostgreSQL); everything else passes
    through. Lets a test see or hold the moment a write starts, whatever form it takes."""

    def __init__(self, db, before) -> None:
        self._db = db
        self._before = before

    def __getattr__(self, name):
        return getattr(self._db, name)

    async def executemany(self, sql, rows):
        await self._before()
        await self._db.executemany(sql, rows)

    @contextlib.asynccontextmanager
    async def transaction(self):
        await self._before()
        async with self._db.transaction() as tx:
            yield tx


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@dataclass
class Harness:
    ctx: Coordinator
    server: TestServer
    admin: CoordinatorClient
    clock: FakeClock
    clients: list

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    def client(self, credential: str | None = None, **kw) -> CoordinatorClient:
        kw.setdefault("clock", self.clock)  # join proofs carry the coordinator's (fake) time
        c = CoordinatorClient(self.url, credential=credential, **kw)
        self.clients.append(c)
        return c

    async def join(self, name: str = "node", *, labels=None, key: keys.KeyPair | None = None, provider="vastai"):
        """Create a token and join a fresh node; return (client with credential, response, keypair)."""
        token = await self.admin.create_join_token(labels=labels or {})
        pair = key or keys.KeyPair(keys.generate_private_key())
        client = self.client()
        response = await client.join(token.token, pair, name, provider)
        return client, response, pair

    async def gateway(self, name: str = "gw", **kw):
        token = await self.admin.create_join_token("gateway")
        pair = keys.KeyPair(keys.generate_private_key())
        client = self.client()
        response = await client.register_gateway(token.token, pair, name, **kw)
        return client, response, pair


async def start_harness(tmp_path: Path, database_url: str, clock: FakeClock, **overrides) -> Harness:
    settings = Settings.for_tests(tmp_path, database_url, poll_interval=0.2, sweep_interval=3600, **overrides)
    await migrated(settings.database_url)
    ctx = await Coordinator.open(settings, clock=clock, environ={})
    server = TestServer(build_app(ctx))
    await server.start_server()
    harness = Harness(ctx, server, None, clock, [])  # type: ignore[arg-type]
    harness.admin = harness.client(admin_token=ctx.admin_token)
    return harness


async def stop_harness(harness: Harness) -> None:
    for c in harness.clients:
        await c.close()
    await harness.server.close()


@pytest.fixture
async def coord(tmp_path: Path, database_url: str, clock: FakeClock):
    harness = await start_harness(tmp_path, database_url, clock)
    try:
        yield harness
    finally:
        await stop_harness(harness)
