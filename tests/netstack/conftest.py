"""Fixtures for the netstack tests."""

from __future__ import annotations

import asyncio

import pytest

from anex_agent.tasks import Tasks


@pytest.fixture
async def tasks():
    """A role's Tasks over a TaskGroup, as the agent gives engines."""
    async with asyncio.TaskGroup() as group:
        owned = Tasks(group, role="test", base=0.05, cap=0.2)
        yield owned
        for task in list(group._tasks):
            task.cancel()
