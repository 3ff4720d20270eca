"""Tasks owned by a role: a failing task is logged and restarted with backoff, or takes the role down loudly."""

from __future__ import annotations

import asyncio
import logging

import pytest

from anex_agent.tasks import Tasks


async def test_a_failing_task_is_logged_and_restarted_with_backoff(caplog):
    runs: list[float] = []

    async def flaky() -> None:
        runs.append(asyncio.get_running_loop().time())
        if len(runs) < 3:
            raise RuntimeError(f"boom {len(runs)}")
        await asyncio.sleep(3600)  # the third run stays up

    caplog.set_level(logging.ERROR, logger="anex_agent.tasks")
    async with asyncio.TaskGroup() as group:
        tasks = Tasks(group, role="agent", base=0.05, cap=0.2)
        task = tasks.spawn("engine-loop", flaky)
        assert task.get_name() == "engine-loop"
        for _ in range(200):
            if len(runs) == 3:
                break
            await asyncio.sleep(0.01)
        task.cancel()  # the owner's stop(): the task simply ends
    assert len(runs) == 3 and tasks.failures["engine-loop"] == 2
    assert runs[1] - runs[0] >= 0.025 and runs[2] - runs[1] >= 0.05  # backoff, growing
    failures = [r for r in caplog.records if "engine-loop failed" in r.getMessage()]
    assert len(failures) == 2 and failures[0].exc_info is not None  # with the traceback
    assert "boom 1" in failures[0].getMessage() and "restarting it in" in failures[0].getMessage()


async def test_a_fatal_task_takes_the_role_down_loudly(caplog):
    async def broken() -> None:
        raise RuntimeError("engine gone")

    async def long_running() -> None:
        await asyncio.sleep(3600)

    with pytest.raises(BaseExceptionGroup) as info:
        async with asyncio.TaskGroup() as group:
            tasks = Tasks(group, role="gateway")
            other = tasks.spawn("heartbeat", long_running)
            tasks.spawn("engine-loop", broken, on_failure="fail")
    assert [str(e) for e in info.value.exceptions] == ["engine gone"]
    assert other.cancelled()  # the rest of the role was stopped
    assert any(r.levelno == logging.CRITICAL and "engine-loop failed" in r.getMessage() for r in caplog.records)


async def test_a_task_that_returns_is_not_restarted():
    calls = []

    async def once() -> None:
        calls.append(1)

    async with asyncio.TaskGroup() as group:
        Tasks(group, role="agent", base=0.01).spawn("once", once)
    assert calls == [1]


def test_backoff_doubles_up_to_the_cap():
    tasks = Tasks(None, role="agent", base=1.0, cap=8.0)  # type: ignore[arg-type]
    for attempt, ceiling in [(0, 1.0), (1, 2.0), (2, 4.0), (3, 8.0), (10, 8.0)]:
        assert ceiling / 2 <= tasks.delay(attempt) <= ceiling


async def test_live_lists_what_still_runs_of_what_was_started_here():
    release = asyncio.Event()
    async with asyncio.TaskGroup() as group:
        tasks = Tasks(group, role="test")
        quick = tasks.create("quick", _nothing())
        waiting = tasks.spawn("waiting", release.wait)
        await quick
        assert tasks.live() == [waiting] and waiting.get_name() == "waiting"
        release.set()
    assert tasks.live() == []


async def _nothing() -> None:
    return None
