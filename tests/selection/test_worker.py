"""The selection worker process: selection work happens outside the coordinator's process, the
worker is restarted when it dies, limits and timeouts answer 503 problem+json, and no worker
outlives its coordinator (stopped, or killed)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import types

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from anex_agent.coordinator import app as coordinator_app
from anex_agent.coordinator.routes import selection as routes_selection
from anex_agent.coordinator.context import Coordinator
from anex_agent.coordinator.settings import Settings
from anex_agent.selection import offers as offers_module
from anex_agent.selection.annotations import parse_annotations
from anex_agent.selection.config import SelectionConfig
from anex_agent.providers.offers_http import HttpPolicy
from anex_agent.providers.vastai.offers import VastAIConfig
from anex_agent.selection.worker import InProcessWorker, SelectionWorker, WorkerBusy, WorkerTimeout, WorkerUnavailable
from anex_agent.selection.worker_process import SELECT, Job
from tests.coordinator.conftest import FakeClock
from tests.selection.fake_providers import FakeProvider
from tests.selection.test_api import Api, telemetry

POLICY = HttpPolicy(timeout=10.0, attempts=1, backoff=0.01, max_backoff=0.02, cache_ttl=0.0)
POD = {"anex.sh/gpu-names": "RTX 4090,RTX 3090"}


def socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets process ``pid`` holds open (``socket:[N]`` fd links)."""
    out = set()
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    out.add(link[8:-1])
    return out


def client_socket_inode(port: int, server_port: int) -> str | None:
    """The inode of the client end of the TCP connection from local port ``port`` to ``server_port``
    (both ports: another connection, to another server, may use the same local port; one closed
    earlier may still be listed, in TIME_WAIT with inode 0)."""
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            parts = line.split()
            if (int(parts[1].split(":")[1], 16) == port and int(parts[2].split(":")[1], 16) == server_port
                    and parts[9] != "0"):
                return parts[9]
    return None


class Harness(Api):
    def __init__(self, server, ctx, fake, clock, worker):
        super().__init__(server, ctx, fake, clock)
        self.worker = worker

    async def select(self, pod=POD, **body):
        return await self.call("POST", "/v1/selections", {"annotations": pod, **body})


def at_our_priority(config: SelectionConfig) -> SelectionWorker:
    """The worker process at the test's own priority (``nice=0``): on a busy machine a niced worker
    waits seconds for the CPU, to answer and to exit (the priority has a test of its own)."""
    return SelectionWorker(config, nice=0)


@contextlib.asynccontextmanager
async def coordinator(tmp_path, worker="process", *, seen=None):
    """A coordinator on SQLite with a fake Vast.AI; ``seen`` (a list) gets, per provider request,
    which processes held the requesting socket. ``worker``: ``"process"`` (at the test's
    priority), ``"inline"``, or a factory of a worker from the config."""
    fake = FakeProvider()
    fake_app = fake.app()
    if seen is not None:
        @web.middleware
        async def who(request, handler):
            inode = client_socket_inode(request.transport.get_extra_info("peername")[1],
                                        request.transport.get_extra_info("sockname")[1])
            holders = {"coordinator": inode in socket_inodes(os.getpid())}
            pid = getattr(harness.worker, "pid", None)
            holders["worker"] = pid is not None and pid != os.getpid() and inode in socket_inodes(pid)
            seen.append(holders)
            return await handler(request)

        fake_app.middlewares.append(who)
    fake_server = TestServer(fake_app, host="127.0.0.1")
    await fake_server.start_server()
    config = SelectionConfig(vastai=VastAIConfig(api_key=fake.api_key, base_url=str(fake_server.make_url("/api/v0")),
                                                 policy=POLICY), policy=POLICY)
    worker = {"process": at_our_priority, "inline": InProcessWorker}.get(worker, worker)(config)
    clock = FakeClock()
    settings = Settings.for_tests(tmp_path, f"sqlite:///{tmp_path / 'c.db'}", poll_interval=0.2, sweep_interval=3600)
    ctx = await Coordinator.open(settings, clock=clock, environ={}, extra_migrations=routes_selection.MIGRATIONS)
    module = types.SimpleNamespace(setup=routes_selection.make_setup(config, worker=worker),
                                   MIGRATIONS=routes_selection.MIGRATIONS)
    core = coordinator_app.load_modules([m for m in coordinator_app.ROUTE_MODULES
                                         if m != "anex_agent.coordinator.routes.selection"])
    server = TestServer(coordinator_app.build_app(ctx, [*core, module]))
    await server.start_server()
    harness = Harness(server, ctx, fake, clock, worker)
    try:
        yield harness
    finally:
        await harness.session.close()
        await harness.admin.close()
        await server.close()
        await fake_server.close()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def wait_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        await asyncio.sleep(0.05)
    return False


async def wait_for(condition, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("mode", ["process", "inline"])
async def test_the_provider_is_asked_and_tables_are_built_outside_the_coordinators_process(tmp_path, monkeypatch,
                                                                                            mode):
    """``inline`` (the same jobs in the coordinator's process) is the control: there, both checks see
    the work in this process, so they would catch selection moving back to the loop or a thread."""
    built_here = []
    real_init = offers_module.OfferTable.__init__

    def spy(self, offers):
        built_here.append(os.getpid())
        real_init(self, offers)

    monkeypatch.setattr(offers_module.OfferTable, "__init__", spy)
    seen: list[dict] = []
    async with coordinator(tmp_path, mode, seen=seen) as api:
        await api.onprem_node("dgx", labels={"price-per-hour": "0.30"}, telemetry=telemetry())
        status, _, body = await api.select()
        assert status == 200, body
        assert {c["provider"] for c in body["candidates"]} == {"vastai", "onprem"}
        assert len(seen) == 1
        if mode == "process":
            assert seen == [{"coordinator": False, "worker": True}]
            assert built_here == []  # neither the Vast.AI table nor the on-prem one was built here
            assert api.worker.pid != os.getpid()
        else:
            assert seen[0]["coordinator"] is True
            assert built_here


def test_the_coordinator_uses_the_process_by_default(tmp_path):
    ctx = types.SimpleNamespace(db=None, clock=time.time)
    assert isinstance(routes_selection.SelectionRoutes(ctx, SelectionConfig()).worker, SelectionWorker)


async def test_the_worker_runs_at_a_lower_priority(tmp_path):
    async with coordinator(tmp_path, SelectionWorker) as api:  # the default priority
        assert (await api.select())[0] == 200
        ours = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, api.worker.pid) == min(ours + 10, 19)


async def test_a_dead_worker_is_restarted_logged_and_the_next_selection_succeeds(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="anex_agent.selection.worker")
    async with coordinator(tmp_path) as api:
        status, _, first = await api.select()
        assert status == 200
        pid = api.worker.pid
        os.kill(pid, signal.SIGKILL)
        assert await wait_gone(pid)
        # the coordinator notices the end of the worker's output, and says so
        await wait_for(lambda: any("exited" in r.getMessage() and str(pid) in r.getMessage() for r in caplog.records))
        status, _, again = await api.select()
        assert status == 200 and again["candidates"] == first["candidates"]
        assert api.worker.pid not in (None, pid) and api.worker.starts == 2


async def test_a_selection_survives_one_worker_death_and_answers_503_after_two(tmp_path):
    async with coordinator(tmp_path) as api:
        assert (await api.select())[0] == 200
        # the worker dies while the provider is slow to answer: a new worker answers it
        api.fake.script.append((200, {}, 5.0))
        pending = asyncio.create_task(api.select())
        await wait_for(lambda: len(api.fake.requests) == 2)
        os.kill(api.worker.pid, signal.SIGKILL)
        status, _, body = await pending
        assert status == 200 and body["candidates"] and api.worker.starts == 2
        # two deaths during one selection: 503, and the next selection is answered again
        api.fake.script += [(200, {}, 5.0), (200, {}, 5.0)]
        pending = asyncio.create_task(api.select())
        for seen in (4, 5):
            await wait_for(lambda: len(api.fake.requests) == seen and api.worker.pid is not None)
            os.kill(api.worker.pid, signal.SIGKILL)
        status, ctype, body = await pending
        assert status == 503 and ctype.startswith("application/problem+json")
        assert body["type"].endswith("selection-unavailable") and "try again" in body["detail"]
        assert api.worker.starts == 3
        status, _, body = await api.select()
        assert status == 200 and body["candidates"] and api.worker.starts == 4


async def test_shutting_the_coordinator_down_stops_the_worker(tmp_path):
    async with coordinator(tmp_path) as api:
        assert (await api.select())[0] == 200
        pid = api.worker.pid
        assert alive(pid)
    assert not alive(pid)  # stopped and reaped during the coordinator's cleanup


def test_a_killed_coordinator_leaves_no_worker(tmp_path):
    """The coordinator dies without cleaning up (SIGKILL): the worker goes too."""
    script = textwrap.dedent("""
        import asyncio, sys
        from anex_agent.selection.config import SelectionConfig
        from anex_agent.selection.worker import SelectionWorker

        async def main():
            worker = SelectionWorker(SelectionConfig())
            await worker._ensure_started()
            print(worker.pid, flush=True)
            await asyncio.sleep(60)

        asyncio.run(main())
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
        assert alive(pid)
        parent.kill()
        parent.wait(10)
        assert asyncio.run(wait_gone(pid))
    finally:
        parent.kill()
        parent.wait(10)


async def test_the_worker_object_limits_jobs_times_out_and_keeps_working(tmp_path):
    fake = FakeProvider()
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    config = SelectionConfig(vastai=VastAIConfig(api_key=fake.api_key, base_url=str(server.make_url("/api/v0")),
                                                 policy=POLICY), policy=POLICY)
    worker = SelectionWorker(config, max_jobs=1, nice=0)
    job = Job(SELECT, parse_annotations(POD), ("vastai",))
    try:
        assert b'"candidates"' in await worker.run(job)
        fake.script.append((200, {}, 5.0))
        worker.job_timeout = 1.0  # for the slow job (a timeout fires late on a loaded machine, never early)
        slow = asyncio.create_task(worker.run(job))
        await wait_for(lambda: len(worker._pending) == 1)
        worker.job_timeout = 120.0
        with pytest.raises(WorkerBusy):
            await worker.run(job)
        with pytest.raises(WorkerTimeout):
            await slow
        await wait_for(lambda: not fake.script)  # the next request of the next job would be answered normally
        fake.script.append((200, {}, 5.0))
        cancelled = asyncio.create_task(worker.run(job))
        await wait_for(lambda: not fake.script)  # its provider request is hanging
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert b'"candidates"' in await worker.run(job)  # the same process, still answering
        assert worker.starts == 1
    finally:
        await worker.aclose()
        await server.close()
    assert worker.pid is None


async def test_a_worker_that_cannot_start_says_so_in_its_own_words_and_logs_the_system_s(tmp_path, caplog):
    missing = str(tmp_path / "no-python-here")
    worker = SelectionWorker(SelectionConfig(policy=POLICY), python=missing)
    try:
        with pytest.raises(WorkerUnavailable) as info:
            await worker.run(Job(SELECT, parse_annotations(POD), ()))
    finally:
        await worker.aclose()
    # the caller (a 503's detail) reads the coordinator's text; the OSError's, with the path, is logged
    assert str(info.value) == "the selection worker could not start; see the coordinator's log"
    assert any(missing in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)


async def test_busy_and_timeout_answer_503_problem_details(tmp_path):
    async with coordinator(tmp_path, lambda config: SelectionWorker(config, max_jobs=1, nice=0)) as api:
        assert (await api.select())[0] == 200
        api.fake.script.append((200, {}, 5.0))
        api.worker.job_timeout = 1.0  # fires late on a loaded machine, never early
        slow = asyncio.create_task(api.select())
        await wait_for(lambda: len(api.worker._pending) == 1)
        status, ctype, body = await api.select()
        assert status == 503 and ctype.startswith("application/problem+json")
        assert body["type"].endswith("selection-busy")
        status, _, body = await slow
        assert status == 503 and body["type"].endswith("selection-timeout")


async def test_the_inline_worker_answers_like_the_process(tmp_path):
    async with coordinator(tmp_path, "process") as api:
        await api.onprem_node("dgx", labels={"price-per-hour": "0.30"}, telemetry=telemetry())
        by_process = (await api.select())[2]
    async with coordinator(tmp_path / "b", "inline") as api:
        await api.onprem_node("dgx", labels={"price-per-hour": "0.30"}, telemetry=telemetry())
        assert isinstance(api.worker, InProcessWorker)
        inline = (await api.select())[2]
    strip = lambda body: [{k: v for k, v in c.items() if k not in ("offer_id", "machine_id")}  # noqa: E731
                          for c in body["candidates"]]
    assert strip(by_process) == strip(inline) and by_process["explanation"]["filters"] == \
        inline["explanation"]["filters"]


async def test_a_large_on_prem_fleet_reaches_the_worker_in_parts_and_whole():
    import json

    from anex_agent.selection.worker_process import NODES_PER_FRAME

    count = 2 * NODES_PER_FRAME + 7
    nodes = [{"id": f"n-{i:05d}", "name": f"gpu-{i}", "provider": "onprem", "state": "ready", "health": "healthy",
              "labels": json.dumps({"price-per-hour": f"{0.10 + i / 10000:.4f}"}), "telemetry": json.dumps(telemetry())}
             for i in range(count)]
    nodes[3]["labels"] = "{not json"
    worker = SelectionWorker(SelectionConfig(), nice=0)
    try:
        body = json.loads(await worker.run(Job(SELECT, parse_annotations(POD), ("onprem",), limit=3, nodes=nodes)))
    finally:
        await worker.aclose()
    report = body["explanation"]["providers"]["onprem"]
    assert report["offers"] == count - 1 and report["skipped"] == {"n-00003": "malformed labels (not JSON)"}
    assert [c["offer_id"] for c in body["candidates"]] == ["n-00000", "n-00001", "n-00002"]


async def test_a_worker_found_dead_before_it_takes_a_job_is_replaced_for_that_job():
    worker = SelectionWorker(SelectionConfig(), nice=0)
    job = Job(SELECT, parse_annotations(POD), ("onprem",))
    try:
        await worker.run(job)
        pid = worker.pid
        os.kill(pid, signal.SIGKILL)
        while alive(pid):  # dead, and (no await) the coordinator has not noticed yet
            time.sleep(0.01)
        assert b'"candidates"' in await worker.run(job)
        assert worker.starts == 2 and worker.pid != pid
    finally:
        await worker.aclose()
