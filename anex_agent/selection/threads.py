"""The selection thread: where offer tables are built and selections computed, inside the
selection worker process (:mod:`anex_agent.selection.worker`).

Decoding a provider answer, turning it into offers, building the column-wise
:class:`~anex_agent.selection.offers.OfferTable` and filtering/ranking it take up to seconds
at 100,000 offers. The coordinator runs none of it: the selection worker process does, and
inside it :func:`run` hands this work to one dedicated thread (``anex-selection``), so that
the worker's own loop keeps reading requests and provider answers meanwhile. The work is pure
Python that gives the GIL back to that loop within 1 ms while a job runs (:data:`SWITCH_INTERVAL`; 5 ms, Python's default, otherwise). Nothing in
it is one long C call: large JSON is decoded and freed in pieces
(:mod:`anex_agent.selection.jsonpieces`), tables keep no object per offer and are built
column by column (:class:`~anex_agent.selection.offers.OfferTable`), and the cyclic garbage
collector, whose full collections walked every offer for 100-200 ms, is paused meanwhile.

One thread: builds queue behind each other (they share one cache per provider query, so a
burst of pods makes one build), and the loop never competes with more than one of them.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

T = TypeVar("T")
THREAD_NAME = "anex-selection"
SWITCH_INTERVAL = 0.001  # seconds: the most the event loop waits for the GIL while a job runs
_executor: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def executor() -> ThreadPoolExecutor:
    """The process-wide selection thread (started on first use; its thread exits with the process)."""
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD_NAME)
        return _executor


def _without_collections(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn`` with the cyclic garbage collector paused and the GIL switch interval at
    :data:`SWITCH_INTERVAL` (both process-wide) while it runs.

    The event loop asking for the GIL gets it from this thread within the switch interval:
    5 ms by default, 1 ms while a job runs.

    A build allocates hundreds of thousands of short-lived objects; each allocation burst
    would trigger full collections that walk every live object while holding the GIL (up to
    150 ms each at 100,000 offers, a stall of every thread, the event loop's included). The
    build's garbage is acyclic and freed by reference counting as it goes; what stays alive
    is a handful of columns, so the collection that runs when the collector resumes is short.
    """
    enabled = gc.isenabled()
    interval = sys.getswitchinterval()
    gc.disable()
    sys.setswitchinterval(min(interval, SWITCH_INTERVAL))
    try:
        return fn(*args, **kwargs)
    finally:
        sys.setswitchinterval(interval)
        if enabled:
            gc.enable()


async def run(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on the selection thread (collector paused meanwhile); its exception,
    if any, is raised here."""
    call = functools.partial(_without_collections, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(executor(), call)


def release(values: list[Any]) -> None:
    """Free ``values`` (large tables no longer needed) on the selection thread: the caller hands
    over its references; whatever nobody else holds is deallocated there, not on the loop."""
    executor().submit(values.clear)
