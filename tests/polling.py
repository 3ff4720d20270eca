"""Polling for tests: wait until something is true, with a deadline generous enough for a busy machine.

Contract: :func:`wait_for` calls ``predicate`` every ``interval`` seconds until it returns a
truthy value, which it returns; after ``timeout`` seconds it raises AssertionError naming
``what``. An exception raised by ``predicate`` is not "not yet": it propagates at once.
:func:`wait_until` is the same for a test running on an event loop (the loop runs meanwhile;
``predicate`` may be a coroutine function).

The deadline is how long the test gives up after, never what it measures: pick it so that a
machine running the suite on two busy cores still sees the event long before it
(:data:`GENEROUS`, the default of both helpers).

One unit for every deadline: :func:`scaled` multiplies seconds by ``ANEX_TEST_TIMEOUT_SCALE``
(a positive number, default 1), so a slower machine raises all deadlines at once instead of
each test carrying its own constant. A deadline only bounds how long a failing test takes: a
passing test returns as soon as its event happens, whatever the scale.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")



def _scale() -> float:
    text = os.environ.get("ANEX_TEST_TIMEOUT_SCALE", "1")
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise SystemExit(f"ANEX_TEST_TIMEOUT_SCALE={text!r}: expected a positive number (1 is the default)")
    return value


#: ``ANEX_TEST_TIMEOUT_SCALE``: the factor every test deadline is multiplied by.
SCALE = _scale()


def scaled(seconds: float) -> float:
    """``seconds`` of test deadline on this machine (times ``ANEX_TEST_TIMEOUT_SCALE``)."""
    return seconds * SCALE


#: A deadline for events a test expects within milliseconds on an idle machine.
GENEROUS = scaled(30.0)


def wait_for(predicate: Callable[[], T], timeout: float = GENEROUS, what: str = "condition", *,
             interval: float = 0.05) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


async def wait_until(predicate: Callable[[], T | Awaitable[T]], timeout: float = GENEROUS,
                     what: str = "condition", *, interval: float = 0.05) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
