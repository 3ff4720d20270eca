"""Fixtures shared across tests/ (each package's own conftest adds its specific ones)."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from anex_agent.client.rest import CoordinatorClient
from anex_agent.coordinator.app import build_app
from anex_agent.coordinator.context import Coordinator
from anex_agent.coordinator.settings import Settings
from tests.sqlite_schema import migrated


@pytest.fixture
async def coordinator(tmp_path: Path):
    """The real coordinator app in-process on SQLite: yields ``(base_url, admin_client)``."""
    settings = Settings.for_tests(tmp_path / "coord", poll_interval=0.2, sweep_interval=3600)
    settings.state_dir.mkdir()
    await migrated(settings.database_url)
    ctx = await Coordinator.open(settings, environ={})
    server = TestServer(build_app(ctx))
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    admin = CoordinatorClient(url, admin_token=ctx.admin_token)
    try:
        yield url, admin
    finally:
        await admin.close()
        await server.close()
        await ctx.close()
