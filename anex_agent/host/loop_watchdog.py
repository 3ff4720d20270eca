"""A watchdog for a role's own event loop: it names whatever keeps the loop from running.

One callback in the loop notes the time every :data:`TICK` seconds; a daemon thread looks
every :data:`TICK` seconds whether that note is older than ``stall_after`` seconds
(default :data:`STALL_AFTER`). When it is, the loop is stuck in one step (a task that does
not yield, a blocking call on the loop): the thread logs, once per stall, the task the loop
is running (``asyncio.current_task(loop)``; "a callback" when it runs none) and where the
loop's thread is (``sys._current_frames()``, the innermost :data:`STACK_LINES` frames).
When the loop runs again, one more line says how long the stall lasted.

Cost when idle: one timer callback and one thread wake-up per :data:`TICK`.

Use: ``tg.create_task(LoopWatchdog().run(), name="loop-watchdog")`` in the role's
TaskGroup; it runs until cancelled, and stops its thread then.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback

log = logging.getLogger(__name__)

#: A step of the event loop that runs longer than this (seconds) is logged as a stall.
STALL_AFTER = 1.0
#: How often the loop notes that it runs, and the thread looks (seconds).
TICK = 0.25
#: How many of the innermost frames of the loop's thread a stall report shows.
STACK_LINES = 8


class LoopWatchdog:
    def __init__(self, *, stall_after: float = STALL_AFTER, tick: float = TICK, logger: logging.Logger = log) -> None:
        self.stall_after = stall_after
        self.tick = tick
        self.log = logger
        self.stalls = 0  # stalls seen so far
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._last_beat = time.monotonic()
        self._stalled_by: str | None = None  # the task named in the open stall's report
        self._handle: asyncio.TimerHandle | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()  # _last_beat and _stalled_by, between the loop and the thread
        self._thread: threading.Thread | None = None

    async def run(self) -> None:
        """Watch the running loop until cancelled."""
        self.start()
        try:
            await asyncio.Future()  # forever
        finally:
            self.stop()

    def start(self) -> None:
        """Start watching the running loop (call from the loop's thread)."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._beat()
        self._thread = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    # ---------------------------------------------------------------- in the loop

    def _beat(self) -> None:
        now = time.monotonic()
        with self._lock:
            stalled_by, self._stalled_by = self._stalled_by, None
            since, self._last_beat = self._last_beat, now
        if stalled_by is not None:
            self.log.warning("event loop ran again after %.1f s stalled by %s", now - since, stalled_by)
        assert self._loop is not None
        self._handle = self._loop.call_later(self.tick, self._beat)

    # ---------------------------------------------------------------- in the thread

    def _watch(self) -> None:
        while not self._stop.wait(self.tick):
            with self._lock:
                late = time.monotonic() - self._last_beat
                if late > self.stall_after and self._stalled_by is None:
                    self._report(late)

    def _report(self, late: float) -> None:
        assert self._loop is not None
        try:
            task = asyncio.current_task(self._loop)
        except RuntimeError:
            task = None
        who = f"task {task.get_name()!r}" if task is not None else "a callback (no task)"
        frame = sys._current_frames().get(self._loop_thread) if self._loop_thread is not None else None
        where = "".join(traceback.format_stack(frame)[-STACK_LINES:]) if frame is not None else "  (no frame)\n"
        self._stalled_by = who
        self.stalls += 1
        self.log.warning("event loop stalled for %.1f s so far by %s (nothing else runs meanwhile: heartbeats, "
                         "the API, signals); it is at:\n%s", late, who, where.rstrip("\n"))
