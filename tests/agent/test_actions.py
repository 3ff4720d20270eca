"""The cluster's actions on the agent API: signal, restart, push a file. Token required even
on loopback; push-file confinement (``..``, symbolic links, outside the directories)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import pytest
from tests.agent.api_client import ApiClient

from anex_agent.wire.access_token import Claims
from anex_agent.agent.actions import PushRefused, add_routes, confine, parse_mode, write_confined
from anex_agent.agent.api import AgentApi
from anex_agent.agent.workload import Workload

TOKENS = iter(f"good-{i}" for i in range(10_000))


def auth():
    return {"Authorization": f"Bearer {next(TOKENS)}"}


def make_api(workload, push_dirs=(), local=True, max_bytes=1024, on_pushed=None):
    async def status():
        return {}

    async def ready():
        return True, ""

    def verify(token, now):
        return Claims("n-1", int(now), int(now) + 60, token_id=token) if token.startswith("good") else None

    api = AgentApi(status, ready, verify, is_local=lambda request: local)
    add_routes(api, lambda: workload, push_dirs=[str(d) for d in push_dirs], max_bytes=max_bytes, on_pushed=on_pushed)
    return api


async def _client(api):
    client = ApiClient(api)
    await client.start_server()
    return client


TRAP = ("import signal,sys,time\n"
        "def h(n,f): print(signal.Signals(n).name, flush=True); n == signal.SIGTERM and sys.exit(0)\n"
        "for s in (signal.SIGUSR1, signal.SIGTERM): signal.signal(s, h)\n"
        "print('up', flush=True)\n"
        "while True: time.sleep(0.05)\n")


async def test_actions_need_a_token_even_on_loopback(tmp_path):
    w = Workload([sys.executable, "-c", TRAP])
    await w.start()
    client = await _client(make_api(w, [tmp_path]))
    try:
        for method, path in (("POST", "/signal?name=TERM"), ("POST", "/restart"), ("PUT", f"/files?path={tmp_path}/x")):
            resp = await client.request(method, path, data=b"x")
            assert resp.status == 401, path
            resp = await client.request(method, path, data=b"x", headers={"Authorization": "Bearer forged"})
            assert resp.status == 403, path
        assert not (tmp_path / "x").exists() and w.proc.returncode is None and w.state.restart_count == 0
        assert (await client.get("/healthz")).status == 200  # other routes stay open on loopback
    finally:
        await client.close()
        await w.terminate(grace=1)


async def test_signal_and_restart():
    w = Workload([sys.executable, "-c", TRAP], grace=5)
    await w.start(stdout=asyncio.subprocess.PIPE)
    assert (await w.proc.stdout.readline()).strip() == b"up"
    client = await _client(make_api(w))
    waiter = asyncio.create_task(w.wait())
    try:
        resp = await client.post("/signal?name=USR1", headers=auth())
        assert resp.status == 202 and (await resp.json())["signal"] == "SIGUSR1"
        assert (await asyncio.wait_for(w.proc.stdout.readline(), 5)).strip() == b"SIGUSR1"
        resp = await client.post("/signal?name=STOP", headers=auth())
        assert resp.status == 400 and (await resp.json())["field"] == "name"
        first = w.proc.pid
        resp = await client.post("/restart", headers=auth())
        assert resp.status == 202
        for _ in range(100):
            if w.proc.pid != first and w.state.state == "running":
                break
            await asyncio.sleep(0.05)
        assert w.proc.pid != first and w.state.restart_count == 1 and not waiter.done()
        resp = await client.post("/signal?name=KILL", headers=auth())
        assert resp.status == 202
        assert await asyncio.wait_for(waiter, 10) == 128 + signal.SIGKILL
        resp = await client.post("/restart", headers=auth())
        assert resp.status == 409  # not running any more
    finally:
        await client.close()
    client = await _client(make_api(None))
    try:
        assert (await client.post("/restart", headers=auth())).status == 404
    finally:
        await client.close()


async def test_push_a_file_atomically_with_its_mode(tmp_path):
    root = tmp_path / "inbox"
    (root / "sub").mkdir(parents=True)
    client = await _client(make_api(None, [root]))
    try:
        resp = await client.put(f"/files?path={root}/sub/model.cfg&mode=0640", data=b"weights=1\n", headers=auth())
        assert resp.status == 201, await resp.text()
        assert await resp.json() == {"path": f"{root}/sub/model.cfg", "bytes": 10, "mode": "0640"}
        assert (root / "sub" / "model.cfg").read_bytes() == b"weights=1\n"
        assert oct((root / "sub" / "model.cfg").stat().st_mode & 0o7777) == "0o640"
        resp = await client.put(f"/files?path={root}/sub/model.cfg", data=b"v2", headers=auth())
        assert resp.status == 201 and (root / "sub" / "model.cfg").read_bytes() == b"v2"
        assert sorted(p.name for p in (root / "sub").iterdir()) == ["model.cfg"]  # no temporary file left
        resp = await client.put(f"/files?path={root}/big", data=b"x" * 2000, headers=auth())
        assert resp.status == 413 and not (root / "big").exists()
        resp = await client.put(f"/files?path={root}/f&mode=4755", data=b"x", headers=auth())
        assert resp.status == 400 and (await resp.json())["field"] == "mode"
        resp = await client.put(f"/files?path={root}/nodir/f", data=b"x", headers=auth())
        assert resp.status == 409
    finally:
        await client.close()


def test_confinement_dotdot_and_outside(tmp_path):
    roots = [str(tmp_path / "inbox")]
    for bad, status in ((f"{tmp_path}/inbox/../secret", 400), (f"{tmp_path}/inbox/./x", 400), ("relative/x", 400),
                        (f"{tmp_path}/inbox//x", 400), (f"{tmp_path}/inboxx/x", 403), (f"{tmp_path}/inbox", 403),
                        ("/etc/passwd", 403), (f"{tmp_path}/inbox/a\0b", 400)):
        with pytest.raises(PushRefused) as err:
            confine(roots, bad)
        assert err.value.status == status, bad
    with pytest.raises(PushRefused) as err:
        confine([], "/tmp/x")
    assert err.value.status == 403
    assert confine(roots, f"{tmp_path}/inbox/a/b/c") == (roots[0], ["a", "b"], "c")
    for everything in ([""], ["/"], ["", "/"]):  # an empty root prefix never holds every path
        with pytest.raises(PushRefused) as err:
            confine(everything, "/var/lib/anex-agent/key")
        assert err.value.status == 403
    assert parse_mode("600") == 0o600
    for bad in ("rw", "0888", "12345", "٦٠٠"):
        with pytest.raises(PushRefused):
            parse_mode(bad)


def test_symbolic_links_do_not_lead_outside(tmp_path):
    root, outside = tmp_path / "inbox", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "target").write_text("keep")
    os.symlink(outside, root / "link")  # a directory link to outside
    with pytest.raises(PushRefused) as err:
        write_confined([str(root)], f"{root}/link/target", [b"evil"], 0o644)
    assert err.value.status == 403
    os.symlink(outside / "target", root / "file-link")  # the file itself a link: replaced, not followed
    assert write_confined([str(root)], f"{root}/file-link", [b"new"], 0o644) == 3
    assert (outside / "target").read_text() == "keep"
    assert not (root / "file-link").is_symlink() and (root / "file-link").read_bytes() == b"new"
    # the configured directory itself a link: refused (O_NOFOLLOW on the root as well)
    os.symlink(outside, tmp_path / "root-link")
    with pytest.raises(PushRefused):
        write_confined([str(tmp_path / "root-link")], f"{tmp_path}/root-link/target", [b"evil"], 0o644)
    assert (outside / "target").read_text() == "keep"


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another account needs root")
async def test_a_pushed_file_belongs_to_the_workload_account(tmp_path):
    import pwd

    from anex_agent.agent.workload import resolve_account

    nobody = pwd.getpwnam("nobody")
    account = resolve_account("nobody", "--user", euid=0)
    w = Workload([sys.executable, "-c", "import time; time.sleep(30)"], account=account)
    root = tmp_path / "inbox"
    root.mkdir()
    client = await _client(make_api(w, [root]))
    try:
        resp = await client.put(f"/files?path={root}/job.yaml&mode=0600", data=b"epochs: 3\n", headers=auth())
        assert resp.status == 201, await resp.text()
        st = (root / "job.yaml").stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (nobody.pw_uid, account.gid, 0o600)
    finally:
        await client.close()
    client = await _client(make_api(None, [root]))  # no workload account: the agent's own
    try:
        assert (await client.put(f"/files?path={root}/mine", data=b"x", headers=auth())).status == 201
        assert (root / "mine").stat().st_uid == os.geteuid()
    finally:
        await client.close()


async def test_each_pushed_file_is_told_to_the_hook_and_a_refused_one_is_not(tmp_path):
    told: list[str] = []
    client = await _client(make_api(None, [tmp_path], on_pushed=told.append))
    try:
        resp = await client.put(f"/files?path={tmp_path}/a.conf&mode=0600", data=b"a", headers=auth())
        assert resp.status == 201
        resp = await client.put(f"/files?path={tmp_path}/missing/b", data=b"b", headers=auth())
        assert resp.status == 409
        assert told == [f"{tmp_path}/a.conf"]
    finally:
        await client.close()
