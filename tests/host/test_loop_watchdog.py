"""The event loop's watchdog names the task that blocks the loop, and says when the loop runs again."""

from __future__ import annotations

import asyncio
import logging
import threading

from anex_agent.host.loop_watchdog import LoopWatchdog


class _Lines(logging.Handler):
    """Keeps the watchdog's lines; sets ``reported`` at the first stall report (logged from its
    thread), and ``ran_again`` when the loop says it runs again (logged from the loop)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.reported = threading.Event()
        self.ran_again = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        if "stalled for" in record.getMessage():
            self.reported.set()
        if "ran again" in record.getMessage():
            self.ran_again.set()


def _hog_the_loop(until: threading.Event) -> None:
    until.wait(60)  # a blocking call on the event loop, as a careless task would make


async def _careless(until: threading.Event) -> None:
    _hog_the_loop(until)


async def test_a_task_that_blocks_the_loop_is_named_with_where_it_is():
    logger = logging.getLogger("test.loop_watchdog")
    lines = _Lines()
    logger.addHandler(lines)
    logger.propagate = False
    watchdog = LoopWatchdog(stall_after=0.2, tick=0.05, logger=logger)
    try:
        async with asyncio.TaskGroup() as tg:
            watching = tg.create_task(watchdog.run(), name="loop-watchdog")
            # blocks the loop until the watchdog reported it (never longer than the 60 s bound)
            await tg.create_task(_careless(lines.reported), name="the-careless-one")
            assert lines.reported.is_set(), "no stall reported while the loop was blocked"
            await lines.ran_again.wait()  # the next beat of the loop closes the stall
            watching.cancel()
    finally:
        logger.removeHandler(lines)
    report = next(line for line in lines.lines if "stalled for" in line)
    assert "task 'the-careless-one'" in report
    assert "_hog_the_loop" in report and "until.wait(60)" in report  # where the loop's thread is
    assert any("ran again" in line and "the-careless-one" in line for line in lines.lines)
    assert watchdog.stalls == 1

