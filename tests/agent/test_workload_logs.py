"""The workload's logs: passed through unchanged, kept with timestamps (ring + rotating file),
served at GET /logs (tail, since, stream, follow) behind the agent API's authentication."""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime, timedelta

import pytest
from tests.agent.api_client import ApiClient

from anex_agent.wire.access_token import Claims
from anex_agent.agent.api import AgentApi
from anex_agent.agent.logs import MAX_LINE, LogStore
from anex_agent.agent.logs_api import add_routes
from anex_agent.agent.workload import Workload

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


class Clock:
    def __init__(self):
        self.now = T0

    def __call__(self):
        self.now += timedelta(seconds=1)
        return self.now


def test_ring_is_bounded_and_file_rotates_in_cri_format(tmp_path):
    store = LogStore(tmp_path / "logs", ring_bytes=64 * 10, file_bytes=300, clock=Clock())
    for i in range(40):
        store.append("stdout" if i % 2 else "stderr", b"line %d" % i)
    lines = store.query()
    assert 1 <= len(lines) <= 10 and lines[-1].text == b"line 39"  # the newest kept, memory bounded
    current = (tmp_path / "logs" / "workload.log").read_bytes()
    old = (tmp_path / "logs" / "workload.log.1").read_bytes()
    assert len(current) <= 300 and len(old) <= 300
    assert current.endswith(b" stdout F line 39\n")
    first = old.splitlines()[0].split(b" ", 3)
    assert first[0].endswith(b"Z") and first[1] in (b"stdout", b"stderr") and first[2] == b"F"
    assert oct((tmp_path / "logs" / "workload.log").stat().st_mode & 0o777) == "0o600"
    assert not (tmp_path / "logs" / "workload.log.2").exists()


def test_query_tail_since_stream():
    store = LogStore(None, clock=Clock())
    for i in range(6):
        store.append("stdout" if i % 2 else "stderr", b"%d" % i)
    assert [x.text for x in store.query(tail=2)] == [b"4", b"5"]
    assert [x.text for x in store.query(stream="stdout")] == [b"1", b"3", b"5"]
    assert [x.text for x in store.query(since=T0 + timedelta(seconds=4))] == [b"3", b"4", b"5"]
    assert [x.text for x in store.query(since=T0 + timedelta(seconds=2), stream="stderr", tail=1)] == [b"4"]
    assert store.query(tail=0) == []


async def test_output_passes_through_unchanged_and_is_kept(capfd, tmp_path):
    long = "y" * (MAX_LINE + 10)
    script = (f"import sys; sys.stdout.write('out 1\\nout 2\\n'); sys.stdout.flush(); "
              f"sys.stderr.write('err \\u00e9\\n'); sys.stderr.flush(); sys.stdout.write('{long}\\nlast-no-newline')")
    store = LogStore(tmp_path)
    w = Workload([sys.executable, "-c", script], logs=store)
    await w.start()
    assert await w.wait() == 0
    out, err = capfd.readouterr()
    assert out == f"out 1\nout 2\n{long}\nlast-no-newline" and err == "err é\n"  # byte for byte
    kept = store.query()
    assert [x.text for x in kept if x.stream == "stderr"] == ["err é".encode()]
    stdout = [x for x in kept if x.stream == "stdout"]
    assert [x.text for x in stdout[:2]] == [b"out 1", b"out 2"]
    assert stdout[2].partial and b"".join(x.text for x in stdout[2:4]) == long.encode() and not stdout[3].partial
    assert stdout[-1].text == b"last-no-newline"
    assert store.closed


def make_api(store, local=True):
    async def status():
        return {}

    async def ready():
        return True, "ok"

    def verify(token, now):
        return Claims("n-1", int(now), int(now) + 60, token_id=token) if token.startswith("good") else None

    api = AgentApi(status, ready, verify, is_local=lambda request: local)
    add_routes(api.app, lambda: store)
    return api


async def _client(api):
    client = ApiClient(api)
    await client.start_server()
    return client


async def test_logs_api_tail_since_stream_and_timestamps():
    store = LogStore(None, clock=Clock())
    for i in range(5):
        store.append("stdout" if i % 2 else "stderr", b"m%d" % i)
    client = await _client(make_api(store))
    try:
        assert await (await client.get("/logs")).text() == "m0\nm1\nm2\nm3\nm4\n"
        assert await (await client.get("/logs?tail=2")).text() == "m3\nm4\n"
        assert await (await client.get("/logs?stream=stderr")).text() == "m0\nm2\nm4\n"
        assert await (await client.get("/logs", params={"since": "2026-01-02T03:04:09Z"})).text() == "m3\nm4\n"
        assert await (await client.get("/logs", params={"since": "2026-01-02T04:04:09+01:00"})).text() == "m3\nm4\n"
        text = await (await client.get("/logs?tail=1&timestamps=1")).text()
        assert text == "2026-01-02T03:04:10.000000Z m4\n"
        for query, field in (("tail=-1", "tail"), ("tail=%D9%A3", "tail"), ("since=yesterday", "since"),
                             ("since=2026-01-02T03:04:05", "since"), ("stream=both", "stream"), ("follow=maybe", "follow")):
            resp = await client.get("/logs?" + query)
            assert resp.status == 400 and resp.content_type == "application/problem+json"
            assert (await resp.json())["field"] == field
    finally:
        await client.close()


async def test_logs_follow_streams_new_lines_until_the_workload_ends():
    store = LogStore(None)
    store.append("stdout", b"before")
    client = await _client(make_api(store))
    try:
        resp = await client.get("/logs?follow=1&stream=stdout")
        assert await resp.content.readline() == b"before\n"
        store.append("stderr", b"not this stream")
        store.append("stdout", b"after")
        assert await asyncio.wait_for(resp.content.readline(), 5) == b"after\n"
        store.close()
        assert await asyncio.wait_for(resp.content.read(), 5) == b""
    finally:
        await client.close()


async def test_logs_need_a_token_from_the_mesh_and_404_without_workload():
    store = LogStore(None)
    store.append("stdout", b"secret output")
    client = await _client(make_api(store, local=False))
    try:
        resp = await client.get("/logs")
        assert resp.status == 401 and "secret" not in await resp.text()
        resp = await client.get("/logs", headers={"Authorization": "Bearer forged"})
        assert resp.status == 403 and "secret" not in await resp.text()
        resp = await client.get("/logs", headers={"Authorization": "Bearer good-1"})
        assert resp.status == 200 and await resp.text() == "secret output\n"
        resp = await client.get("/logs", headers={"Authorization": "Bearer good-1"})  # single use
        assert resp.status == 401
    finally:
        await client.close()
    client = await _client(make_api(None))
    try:
        assert (await client.get("/logs")).status == 404
    finally:
        await client.close()
