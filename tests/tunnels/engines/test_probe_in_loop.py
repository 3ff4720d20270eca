"""detect() inside a running event loop: pyroute2's sync API must run off the loop (no unawaited coroutine)."""

from __future__ import annotations

import asyncio
import gc
import sys
import warnings

import pytest

from anex_agent.tunnels.engines import detect, kernel
from anex_agent.tunnels.os import caps


@pytest.fixture
def unraisable():
    """Collects what Python reports as 'Exception ignored in ...' (where 'never awaited' warnings end up)."""
    seen = []
    old = sys.unraisablehook
    sys.unraisablehook = lambda info: seen.append(info)
    gc.collect()  # what earlier tests left behind is not ours to judge
    seen.clear()
    try:
        yield seen
    finally:
        sys.unraisablehook = old


@pytest.mark.filterwarnings("error")
async def test_detect_inside_a_running_loop_leaves_no_unawaited_coroutine(monkeypatch, unraisable):
    # with CAP_NET_ADMIN "held", the kernel probe really talks netlink through pyroute2
    monkeypatch.setattr(kernel, "has_capability", lambda cap: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = detect.detect()
        gc.collect()
    reason = report.engines["kernel"].reason
    assert "probe failed" not in reason and "already running" not in reason, reason
    assert reason.startswith(("the kernel has no wireguard", "creating a wireguard link", "a wireguard link can be created",
                              "netlink is not usable")), reason
    assert unraisable == [], [str(u.exc_value) for u in unraisable]


async def test_call_off_loop_runs_blocking_work_outside_the_running_loop():
    def no_loop_here():
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return "no loop"
        return "loop"

    assert caps.call_off_loop(no_loop_here) == "no loop"


async def test_call_off_loop_reraises_in_the_caller():
    def boom():
        raise ValueError("from the worker")

    with pytest.raises(ValueError, match="from the worker"):
        caps.call_off_loop(boom)


def test_call_off_loop_without_a_loop_calls_directly():
    import threading

    assert caps.call_off_loop(threading.current_thread) is threading.current_thread()
