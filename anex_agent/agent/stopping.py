"""Stopping the node agent within a bound, whatever a task or the network does.

Contract:

* :class:`ExitDeadline` is the last resort. :meth:`ExitDeadline.arm` (when the stop begins:
  the workload ended, or a stop signal) starts a daemon thread that ends the process with
  the status given (``os._exit``) at the deadline unless it ended before: a task that never
  ends, a teardown step that hangs, or the interpreter's own shutdown (which waits for
  worker threads) cannot hold the exit. Arming again only ever brings the deadline closer
  (a second signal). Disabled (the default) it does nothing: the agent in a test process.
* :func:`cancel_and_wait` cancels tasks and waits :data:`CANCEL_WAIT` s at most for them to
  end, cancelling those that go on again (a task that swallowed one cancellation ends at
  its next ``await``); those still running at the bound are logged by name with where they
  are, and left to the deadline.
* :class:`Teardown` runs each teardown step bounded (``step``); :meth:`Teardown.hurry` (a
  second SIGTERM/SIGINT) cuts the step that runs to :data:`HURRY_STEP` s from now and every
  later one to as much.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable

log = logging.getLogger(__name__)

#: Seconds from the start of the stop (the workload ended, or a stop signal without one)
#: until the process exits anyway: the last heartbeat, the tasks' ends, the teardown.
STOP_MARGIN = 10.0
#: The same after a second SIGTERM/SIGINT during the stop.
HURRY_MARGIN = 3.0
#: How long cancelled tasks get to end, and how often the ones that go on are cancelled again.
CANCEL_WAIT = 3.0
RECANCEL_EVERY = 1.0
#: One teardown step's bound, and what is left to each step after a second signal.
STEP_TIMEOUT = 3.0
HURRY_STEP = 0.5
#: How many frames of a task that would not end the log shows.
STACK_FRAMES = 6


class ExitDeadline:
    def __init__(self, *, enabled: bool = False, exit: Callable[[int], object] = os._exit) -> None:
        self.enabled = enabled
        self._exit = exit
        self._cond = threading.Condition()
        self._deadline: float | None = None  # time.monotonic()
        self._code = 1
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float, code: int) -> None:
        """Exit with ``code`` ``seconds`` from now at the latest (an earlier deadline stays)."""
        if not self.enabled:
            return
        with self._cond:
            at = time.monotonic() + seconds
            if self._deadline is None or at < self._deadline:
                self._deadline = at
            self._code = code
            self._cond.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._wait, name="exit-deadline", daemon=True)
                self._thread.start()

    def _wait(self) -> None:
        with self._cond:
            while True:
                assert self._deadline is not None
                left = self._deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            code = self._code
        log.error("stopping did not finish in time; exiting now with status %d", code)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        self._exit(code)


async def cancel_and_wait(tasks: Iterable[asyncio.Task], *, timeout: float = CANCEL_WAIT,
                          every: float = RECANCEL_EVERY) -> list[asyncio.Task]:
    """Cancel ``tasks`` and wait for their end, ``timeout`` s at most; the ones still running then
    (logged with where they are). Never raises their errors: the TaskGroup that owns them does."""
    pending = {t for t in tasks if not t.done()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while pending:
        for task in pending:
            task.cancel()
        left = deadline - loop.time()
        if left <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=min(every, left))
    for task in pending:
        where = "".join(f"\n  {f.f_code.co_filename}:{f.f_lineno} in {f.f_code.co_name}"
                        for f in task.get_stack(limit=STACK_FRAMES))
        log.error("task %s did not end within %.0f s of being cancelled; it is at:%s", task.get_name(), timeout,
                  where or " (no frame)")
    return sorted(pending, key=lambda t: t.get_name())


class Teardown:
    """Bounded teardown steps; see the module docstring."""

    def __init__(self, step_timeout: float = STEP_TIMEOUT) -> None:
        self.step_timeout = step_timeout
        self.hurried = False
        self._current: asyncio.Timeout | None = None

    def hurry(self) -> None:
        """Cut the running step to :data:`HURRY_STEP` s from now, and every later step to as much."""
        self.hurried = True
        if self._current is not None:
            cut = asyncio.get_running_loop().time() + HURRY_STEP
            when = self._current.when()
            if when is None or when > cut:
                try:
                    self._current.reschedule(cut)
                except RuntimeError:  # it is expiring already
                    pass

    async def step(self, name: str, work: Callable[[], Awaitable[object]], timeout: float | None = None) -> bool:
        """Run ``work()`` for ``timeout`` s (default: the step timeout; after :meth:`hurry`, less) at
        most; False when it failed or ran over (logged), True when it finished."""
        bound = min(timeout or self.step_timeout, HURRY_STEP) if self.hurried else (timeout or self.step_timeout)
        try:
            async with asyncio.timeout(bound) as self._current:
                await work()
            return True
        except TimeoutError:
            log.warning("stopping: %s did not finish in time; going on", name)
        except Exception as err:
            log.warning("stopping: %s failed: %s", name, err)
        finally:
            self._current = None
        return False
