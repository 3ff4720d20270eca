"""Tasks owned by a role: every background task is named and lives in the role's TaskGroup.

A role (the node agent, the gateway) opens one :class:`asyncio.TaskGroup` and wraps it in
:class:`Tasks`; whatever it starts (engines' loops, the endpoint follower) goes through
:meth:`Tasks.spawn`, never a bare ``asyncio.create_task``. What happens when a task fails
is decided when it is spawned, and it is never silent:

* ``on_failure="restart"`` (default): the exception is logged with its traceback and the
  task is run again after a :class:`anex_agent.backoff.Backoff` delay (``base`` doubling up
  to ``cap`` seconds, its jitter; a run that lasted ``healthy_after`` seconds resets it). The failures are
  counted in :attr:`Tasks.failures`.
* ``on_failure="fail"``: the exception is logged and raised, so the TaskGroup cancels
  the role's other tasks and the role stops with that error.

A task that returns, or is cancelled (its owner's ``stop()``), simply ends.

:meth:`Tasks.create` starts a task that is not restarted (a plain ``create_task`` in the
group, named); :meth:`Tasks.live` lists what was started through this object and still
runs, so that the role can cancel it all within a bound when it stops.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal

from anex_agent.backoff import Backoff

if TYPE_CHECKING:
    import random

log = logging.getLogger(__name__)

#: First delay before a failed task runs again, and the most it grows to (seconds).
RESTART_BASE = 1.0
RESTART_CAP = 30.0
#: A run that lasted this long (seconds) before it failed counts as healthy: the backoff starts over.
HEALTHY_AFTER = 60.0


class Tasks:
    """Spawns named tasks into ``group`` (the role's TaskGroup); see the module docstring."""

    def __init__(self, group: asyncio.TaskGroup, *, role: str, base: float = RESTART_BASE, cap: float = RESTART_CAP,
                 healthy_after: float = HEALTHY_AFTER, rng: random.Random | None = None) -> None:
        self.group = group
        self.role = role
        self.base = base
        self.cap = cap
        self.healthy_after = healthy_after
        self._rng = rng
        #: failures seen per task name (restarted or not)
        self.failures: collections.Counter[str] = collections.Counter()
        self._live: set[asyncio.Task] = set()

    def spawn(self, name: str, run: Callable[[], Awaitable[None]], *,
              on_failure: Literal["restart", "fail"] = "restart") -> asyncio.Task[None]:
        """Start ``run()`` as task ``name``. ``run`` is called again for each restart (a fresh coroutine)."""
        if on_failure not in ("restart", "fail"):
            raise ValueError(f"on_failure must be 'restart' or 'fail', not {on_failure!r}")
        return self.create(name, self._guard(name, run, on_failure))

    def create(self, name: str, coro) -> asyncio.Task:
        """Start ``coro`` as task ``name`` in the group, as it is: not restarted, its failure is the group's."""
        task = self.group.create_task(coro, name=name)
        self._live.add(task)
        task.add_done_callback(self._live.discard)
        return task

    def live(self) -> list[asyncio.Task]:
        """The tasks started here that have not ended yet."""
        return [t for t in self._live if not t.done()]

    async def _guard(self, name: str, run: Callable[[], Awaitable[None]], on_failure: str) -> None:
        loop = asyncio.get_running_loop()
        backoff = self._backoff()
        while True:
            started = loop.time()
            try:
                await run()
                return
            except asyncio.CancelledError:
                raise
            except Exception as err:
                self.failures[name] += 1
                if on_failure == "fail":
                    log.critical("%s: task %s failed; stopping the %s: %s", self.role, name, self.role, err, exc_info=True)
                    raise
                if loop.time() - started >= self.healthy_after:
                    backoff.reset()
                delay = backoff.next_delay()
                log.error("%s: task %s failed (%d time(s)); restarting it in %.1f s: %s",
                          self.role, name, self.failures[name], delay, err, exc_info=True)
                await asyncio.sleep(delay)

    def _backoff(self) -> Backoff:
        return Backoff(base=self.base, cap=self.cap, rng=self._rng)

    def delay(self, attempt: int) -> float:
        """The delay before restart number ``attempt`` (0-based): :meth:`Backoff.delay` of ``base`` and ``cap``."""
        return self._backoff().delay(attempt)
