"""Fixtures for the engine tests."""

from __future__ import annotations

import asyncio

import pytest

from anex_agent.tasks import Tasks


@pytest.fixture
async def tasks():
    """A role's Tasks over a TaskGroup, as the agent and gateway give engines (fast restarts for tests)."""
    async with asyncio.TaskGroup() as group:
        owned = Tasks(group, role="test", base=0.05, cap=0.2)
        yield owned
        for task in list(group._tasks):  # whatever the engines left running ends with the test
            task.cancel()
