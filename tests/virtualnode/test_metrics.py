"""The virtual node's metrics endpoint: GET /metrics serves the registry (pods by phase read from the
controller's cache at scrape time, counts only), other paths 404, a taken port names the flag."""

from __future__ import annotations

import asyncio
import socket

import pytest

from anex_agent.errors import EngineError
from anex_agent.virtualnode.metrics import PodMetrics
from tests.gateway.test_metrics import free_port, samples, scrape


async def test_a_scrape_shows_pods_by_phase_and_no_names():
    metrics = PodMetrics(clock=lambda: 5.0)
    pods = {"u1": {"metadata": {"name": "secret-pod"}, "status": {"phase": "Running"}},
            "u2": {"metadata": {"name": "other"}, "status": {}},
            "u3": {"metadata": {"name": "third"}, "status": {"phase": "Failed"}}}
    metrics.watch_pods(lambda: pods)
    metrics.phase_written("u3", "Failed", "MachineLost")
    port = free_port()
    await metrics.serve("127.0.0.1", port)
    try:
        status, text, headers = await asyncio.to_thread(scrape, port)
        assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
        got = samples(text)
        assert got[("anex_virtual_node_pods", (("phase", "Running"),))] == 1
        assert got[("anex_virtual_node_pods", (("phase", "Pending"),))] == 1  # no phase yet: Pending
        assert got[("anex_virtual_node_pods", (("phase", "Succeeded"),))] == 0
        assert got[("anex_virtual_node_pod_failures_total", (("reason", "MachineLost"),))] == 1
        assert "secret-pod" not in text and "process_resident_memory_bytes" in text
        del pods["u1"]
        again = samples((await asyncio.to_thread(scrape, port))[1])
        assert again[("anex_virtual_node_pods", (("phase", "Running"),))] == 0  # read at scrape time
        assert (await asyncio.to_thread(scrape, port, "/status"))[0] == 404
    finally:
        await metrics.close()


async def test_a_port_in_use_is_an_error_naming_the_flag():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(EngineError, match=r"cannot serve metrics on 127\.0\.0\.1:\d+ \(--metrics-listen\)"):
            await PodMetrics().serve("127.0.0.1", taken.getsockname()[1])
