"""BurstTrimmer: the heap goes back to the system once a burst of connections is over, not before."""

from __future__ import annotations

import platform

import pytest

from anex_agent.netstack import trim
from anex_agent.netstack.trim import BurstTrimmer


def test_trims_once_the_count_falls_to_a_quarter_of_the_peak():
    calls = []
    trimmer = BurstTrimmer(min_peak=64, release=lambda: calls.append(1) or True)
    for count in range(0, 501):
        assert not trimmer.observe(count)
    for count in range(500, 125, -1):  # still above a quarter of the peak
        assert not trimmer.observe(count)
    assert calls == []
    assert trimmer.observe(125)
    assert calls == [1] and trimmer.trims == 1
    for count in range(124, -1, -1):  # the new peak is 125: falls to 31 → trims again
        trimmer.observe(count)
    assert trimmer.trims == 2 and calls == [1, 1]


def test_small_bursts_never_trim():
    trimmer = BurstTrimmer(min_peak=64, release=lambda: True)
    for _ in range(10):
        for count in list(range(0, 63)) + list(range(63, -1, -1)):
            assert not trimmer.observe(count)
    assert trimmer.trims == 0


def test_release_free_memory_on_glibc():
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("malloc_trim is glibc's")
    assert trim.release_free_memory() is True


async def test_the_runtime_trims_after_its_connections_are_gone():
    from anex_agent.netstack.aio import NetstackRuntime
    from anex_agent.netstack.stack import Stack

    runtime = NetstackRuntime(Stack("10.44.0.1"), lambda packet: None)
    seen: list[int] = []
    runtime.trimmer = BurstTrimmer(min_peak=8, release=lambda: seen.append(len(runtime.stack.conns)) or True)
    for _ in range(10):
        runtime.open("10.44.0.2", 80)
    runtime._flush()
    assert seen == [] and runtime.trimmer.peak == 10
    runtime.close()  # every connection reset
    assert seen == [0] and runtime.report()["heap_trims"] == 1
