"""The workload's probes (ANEX_PROBES): parsed once naming the field, run next to the workload
as a kubelet runs them (readiness flips ``ready``, a startup probe holds ``started``, a failed
liveness probe stops the run and its restart policy decides), and a state change hurries the
next heartbeat."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import signal
import socket
import sys

import pytest
from aiohttp import web

from anex_agent.agent import heartbeat, run_options
from anex_agent.agent.probe_spec import Probe, ProbeSet, parse
from anex_agent.agent import probes as probes_module
from anex_agent.agent.probes import Prober, check
from anex_agent.agent.restart_policy import CrashLoopBackoff
from anex_agent.agent.workload import Workload
from anex_agent.errors import ConfigError
from tests.polling import wait_until

QUICK = dict(period=0.05, timeout=5.0)  # the probes' own pace; the tests wait for the events, not a time


def test_the_spec_is_read_with_kubernetes_defaults():
    probes = parse(json.dumps({
        "liveness": {"exec": {"command": ["cat", "/tmp/healthy"]}},
        "readiness": {"httpGet": {"port": 8080, "path": "/ready", "httpHeaders": [{"name": "X-A", "value": "1"}]},
                      "successThreshold": 2, "periodSeconds": 3, "initialDelaySeconds": 5},
        "startup": {"tcpSocket": {"port": 22}, "failureThreshold": 30, "terminationGracePeriodSeconds": 4}}))
    assert probes.liveness == Probe(kind="liveness", handler="exec", command=("cat", "/tmp/healthy"))
    assert probes.liveness.period == 10 and probes.liveness.timeout == 1 and probes.liveness.failure_threshold == 3
    ready = probes.readiness
    assert (ready.handler, ready.host, ready.port, ready.path, ready.scheme) == ("httpGet", "127.0.0.1", 8080,
                                                                                 "/ready", "HTTP")
    assert ready.headers == (("X-A", "1"),) and ready.success_threshold == 2 and ready.initial_delay == 5
    assert probes.startup.failure_threshold == 30 and probes.startup.grace == 4
    assert not parse("") and not parse(None)
    args = argparse.Namespace(grace_period=None, wait_ready=None)
    assert run_options.from_args(args, {"ANEX_PROBES": json.dumps({"liveness": {"tcpSocket": {"port": 1}}})}).probes


@pytest.mark.parametrize("raw, named", [
    ("{", "is not JSON"),
    (json.dumps({"lively": {}}), "'lively' is not one"),
    (json.dumps({"liveness": {"tcpSocket": {"port": "http"}}}), "liveness.tcpSocket.port"),
    (json.dumps({"liveness": {"exec": {"command": []}}}), "liveness.exec.command"),
    (json.dumps({"readiness": {"exec": {"command": ["x"]}, "tcpSocket": {"port": 1}}}), "exactly one of"),
    (json.dumps({"liveness": {"exec": {"command": ["x"]}, "successThreshold": 2}}), "liveness.successThreshold"),
    (json.dumps({"readiness": {"httpGet": {"port": 1, "scheme": "FTP"}}}), "readiness.httpGet.scheme"),
    (json.dumps({"readiness": {"exec": {"command": ["x"]}, "periodSeconds": 0}}), "readiness.periodSeconds"),
    (json.dumps({"liveness": {"tcpSocket": {"port": 1, "host": "a" * 70}}}), "liveness.tcpSocket.host"),
    (json.dumps({"readiness": {"httpGet": {"port": 1, "host": "no/slash"}}}), "readiness.httpGet.host"),
    (json.dumps({"startup": {"exec": {"command": ["sh", "a\0b"]}}}), "startup.exec.command[1]"),
])
def test_a_bad_spec_is_one_error_naming_the_variable_and_the_field(raw, named):
    with pytest.raises(ConfigError) as err:
        parse(raw)
    assert err.value.source == "ANEX_PROBES" and named in str(err.value)


class Health:
    """An HTTP endpoint whose answer the test sets."""

    def __init__(self) -> None:
        self.status = 503
        self.seen_headers: list[dict[str, str]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.seen_headers.append(dict(request.headers))
        return web.Response(status=self.status, text="state")


async def _serve(health: Health) -> tuple[web.AppRunner, int]:
    app = web.Application()
    app.router.add_get("/ready", health.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]


async def _stop(workload: Workload, waiter: asyncio.Task) -> None:
    await workload.terminate(grace=5)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)


async def test_readiness_flips_ready_both_ways_and_each_flip_is_heard(tmp_path):
    health = Health()
    runner, port = await _serve(health)
    probe = Probe(kind="readiness", handler="httpGet", port=port, path="/ready", headers=(("X-Probe", "yes"),),
                  success_threshold=2, failure_threshold=2, **QUICK)
    w = Workload(["sleep", "60"], prober=Prober(ProbeSet(readiness=probe)))
    changes: list[tuple[str, bool | None]] = []
    w.tracker.listeners.append(lambda: changes.append((w.state.state, w.state.ready)))
    await w.start()
    waiter = asyncio.create_task(w.wait(), name="test-workload")
    try:
        assert w.state.state == "running" and w.state.ready is False and w.state.started is True
        await wait_until(lambda: len(health.seen_headers) >= 3, what="the probe failing a few times")
        assert w.state.ready is False
        health.status = 200
        await wait_until(lambda: w.state.ready is True, what="ready after two successes")
        assert health.seen_headers[-1]["X-Probe"] == "yes" and health.seen_headers[-1]["User-Agent"].startswith(
            "kube-probe/")
        health.status = 500
        await wait_until(lambda: w.state.ready is False, what="not ready after two failures")
        flips = [c for i, c in enumerate(changes) if i == 0 or c != changes[i - 1]]
        assert flips[-2:] == [("running", True), ("running", False)]
        assert w.state.state == "running" and w.state.restart_count == 0  # readiness never restarts
        assert w.state.probe_failures == 1 and w.state.probe_message.startswith("Readiness probe failed: GET ")
        assert "HTTP 500" in w.state.probe_message
    finally:
        await _stop(w, waiter)
        await runner.cleanup()


async def test_a_failed_liveness_probe_stops_the_run_and_never_ends_the_pod_under_never():
    probe = Probe(kind="liveness", handler="exec", command=("false",), failure_threshold=2, **QUICK)
    w = Workload(["sleep", "60"], prober=Prober(ProbeSet(liveness=probe)))
    await w.start()
    code = await asyncio.wait_for(w.wait(), 60)
    assert code == 143 and w.state.state == "terminated" and w.state.reason == "Error" and w.state.restart_count == 0


class Tiny(CrashLoopBackoff):
    def next_delay(self, ran_for: float) -> float:
        super().next_delay(ran_for)
        return 0.01


async def test_a_failed_liveness_probe_restarts_in_place_under_always_and_counts_it(tmp_path):
    sick = tmp_path / "sick"
    sick.touch()
    probe = Probe(kind="liveness", handler="exec", command=("sh", "-c", f"test ! -e {sick}"), failure_threshold=1,
                  grace=5, **QUICK)
    w = Workload(["sleep", "60"], restart_policy="Always", backoff=Tiny(), prober=Prober(ProbeSet(liveness=probe)))
    ends: list[tuple[int | None, str]] = []
    w.tracker.listeners.append(lambda: ends.append((w.state.exit_code, w.state.reason))
                               if w.state.state == "terminated" else None)
    await w.start()
    waiter = asyncio.create_task(w.wait(), name="test-workload")
    try:
        await wait_until(lambda: w.state.restart_count >= 1, what="the workload started again")
        sick.unlink()  # healthy from now on
        await wait_until(lambda: w.state.state == "running", what="running again")
        assert ends and ends[0] == (143, "Error") and not waiter.done()
        assert w.state.probe_failures >= 1 and w.state.probe_message.startswith("Liveness probe failed: exit status 1")
        assert "Always" in w.state.probe_message
    finally:
        await _stop(w, waiter)


async def test_a_startup_probe_holds_started_and_ready_until_it_passes():
    with socket.socket() as reserved:
        reserved.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        port = reserved.getsockname()[1]
        probe = Probe(kind="startup", handler="tcpSocket", port=port, failure_threshold=10_000, **QUICK)
        w = Workload([sys.executable, "-c", "import time; time.sleep(60)"],
                     prober=Prober(ProbeSet(startup=probe)))
        await w.start()
        waiter = asyncio.create_task(w.wait(), name="test-workload")
        try:
            assert (w.state.started, w.state.ready) == (False, False)
            assert (await check(probe, w))[0] is False
            reserved.listen()
            await wait_until(lambda: w.state.started is True, what="started once the port answers")
            assert w.state.ready is True  # no readiness probe: ready once started
        finally:
            await _stop(w, waiter)


async def test_an_exec_probe_past_its_timeout_fails_and_leaves_no_process(monkeypatch):
    # the probe's process is seen as it is made (not through a file it would have to write in time):
    # whether the timeout comes before or after the shell runs, its process group must be gone
    made = []
    create = asyncio.create_subprocess_exec

    async def spy(*args, **kwargs):
        made.append(await create(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(probes_module.asyncio, "create_subprocess_exec", spy)
    probe = Probe(kind="liveness", handler="exec", command=("sh", "-c", "exec sleep 600"), period=1, timeout=0.2)
    ok, why = await check(probe, Workload(["true"]))
    assert not ok and "no answer within" in why
    (proc,) = made
    assert proc.returncode == -signal.SIGKILL
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)


@pytest.mark.parametrize("probe", [
    Probe(kind="liveness", handler="tcpSocket", host="a" * 70, port=1, timeout=5.0),  # UnicodeError: label too long
    Probe(kind="liveness", handler="httpGet", host="a" * 70, port=1, timeout=5.0),
    Probe(kind="liveness", handler="exec", command=("echo", "a\0b"), timeout=5.0),  # ValueError: embedded null byte
])
async def test_any_error_of_one_check_is_a_failure_never_an_escape(probe, caplog):
    ok, why = await check(probe, Workload(["true"]))
    assert ok is False and why and why.isprintable() and len(why) <= probes_module.WHY_MAX
    caplog.set_level(logging.INFO, logger="anex_agent")
    prober = Prober(ProbeSet(liveness=dataclasses.replace(probe, period=0.05, failure_threshold=10_000)))
    w = Workload([sys.executable, "-c", "import time; time.sleep(60)"], prober=prober)
    await w.start()
    waiter = asyncio.create_task(w.wait(), name="test-workload")
    try:
        await wait_until(lambda: "liveness probe" in caplog.text and "failed" in caplog.text,
                         what="the failing check logged")
        assert not waiter.done()  # the run goes on: the error did not escape into its TaskGroup
    finally:
        await _stop(w, waiter)


async def test_a_cancel_lost_inside_a_check_still_cancels_it(monkeypatch):
    """What Python 3.11's ``wait_for`` does when the cancel and the inner result come at once: the
    awaited call swallows the CancelledError and raises its own error. The check must still end
    cancelled, or the probe loop goes on and the workload's stop waits for it for ever."""
    entered = asyncio.Event()

    async def swallowing(probe):
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise OSError("the inner call's own error, the cancel lost") from None

    monkeypatch.setattr(probes_module, "_tcp", swallowing)
    probe = Probe(kind="liveness", handler="tcpSocket", host="127.0.0.1", port=1, timeout=5.0)
    task = asyncio.create_task(check(probe, Workload(["true"])), name="test-check")
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()


async def test_without_probes_ready_and_started_stay_unknown():
    w = Workload(["true"])
    await w.start()
    assert (w.state.ready, w.state.started) == (None, None)
    await w.wait()


async def test_a_state_change_hurries_the_next_heartbeat():
    class Agent:
        heartbeat_wanted = asyncio.Event()

    agent = Agent()
    pausing = asyncio.create_task(heartbeat.pause(agent, 3600), name="test-pause")
    agent.heartbeat_wanted.set()
    await asyncio.wait_for(pausing, 60)  # long before the interval of an hour
    assert not agent.heartbeat_wanted.is_set()
