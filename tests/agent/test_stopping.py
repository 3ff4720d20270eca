"""The agent's stop is bounded: tasks that swallow a cancellation, teardown steps that hang,
and, as the last resort, the exit deadline."""

from __future__ import annotations

import asyncio
import logging
import threading

from anex_agent.agent.stopping import ExitDeadline, Teardown, cancel_and_wait


async def test_a_task_that_swallowed_its_cancellation_and_waits_again_is_cancelled_again(caplog):
    """What the watch task did: cancelled while a step swallowed the cancellation, it went back
    to waiting on the coordinator's stream ("cancelling", stuck in recv) and the agent hung."""
    started, swallowed = asyncio.Event(), asyncio.Event()

    async def watch_like():
        try:
            started.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            swallowed.set()  # a careless step: the cancellation is lost here
        await asyncio.Event().wait()  # back to "recv"

    task = asyncio.create_task(watch_like(), name="watch")
    await started.wait()
    left = await cancel_and_wait([task], timeout=30, every=0.01)
    assert swallowed.is_set() and task.cancelled() and left == []


async def test_a_task_that_never_ends_is_named_with_where_it_is_and_left_behind(caplog):
    started, gave_up = asyncio.Event(), asyncio.Event()

    async def stubborn():
        started.set()
        while not gave_up.is_set():
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                pass

    task = asyncio.create_task(stubborn(), name="stubborn-one")
    await started.wait()
    with caplog.at_level(logging.ERROR, logger="anex_agent.agent.stopping"):
        left = await cancel_and_wait([task], timeout=0.1, every=0.02)
    assert left == [task] and not task.done()
    line = next(r.getMessage() for r in caplog.records if "did not end" in r.getMessage())
    assert "stubborn-one" in line and "in stubborn" in line
    gave_up.set()
    task.cancel()
    await asyncio.wait({task})


async def test_a_hanging_teardown_step_is_cut_and_the_next_ones_run(caplog):
    teardown = Teardown()
    ran = []

    async def hangs():
        await asyncio.Event().wait()

    async def fine():
        ran.append("fine")

    with caplog.at_level(logging.WARNING, logger="anex_agent.agent.stopping"):
        assert not await teardown.step("closing something that hangs", hangs, timeout=0.05)
        assert await teardown.step("closing the rest", fine)
    assert ran == ["fine"]
    assert any("closing something that hangs did not finish in time" in r.getMessage() for r in caplog.records)


async def test_a_second_signal_cuts_the_running_step_short():
    teardown = Teardown()
    entered = asyncio.Event()

    async def slow():
        entered.set()
        await asyncio.Event().wait()

    step = asyncio.create_task(teardown.step("a slow step", slow, timeout=3600))
    await entered.wait()
    teardown.hurry()  # what a second SIGTERM during the stop does
    assert await asyncio.wait_for(step, 30) is False


def test_the_exit_deadline_ends_the_process_with_the_status_when_the_stop_hangs():
    exited: list[int] = []
    done = threading.Event()

    def fake_exit(code: int) -> None:
        exited.append(code)
        done.set()

    deadline = ExitDeadline(enabled=True, exit=fake_exit)
    deadline.arm(3600, 143)
    deadline.arm(0.05, 143)  # a second signal brings it closer
    deadline.arm(3600, 143)  # never further away again
    assert done.wait(30)
    assert exited == [143]


def test_a_disabled_exit_deadline_never_exits():
    deadline = ExitDeadline(exit=lambda code: (_ for _ in ()).throw(AssertionError("exited")))
    deadline.arm(0, 1)
    assert deadline._thread is None
