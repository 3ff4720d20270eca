"""Polling for tests that start real processes: wait until something is true.

Contract: :func:`wait_for` calls ``predicate`` every ``interval`` seconds until it returns a
truthy value, which it returns; after ``timeout`` seconds it raises AssertionError naming
``what``. An exception raised by ``predicate`` is not "not yet": it propagates at once.
:func:`wait_until` is the same for a test running on an event loop (the loop runs meanwhile).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 15.0, what: str = "condition", *,
             interval: float = 0.05) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


async def wait_until(predicate: Callable[[], T], timeout: float = 15.0, what: str = "condition", *,
                     interval: float = 0.05) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
