"""Real coordinator processes started with the CLI users use (python -m anex_agent coordinator).

* it starts with no arguments and serves the OpenAPI document;
* two processes on one PostgreSQL: 200 concurrent joins split between them get 200
  distinct addresses; a join through one reaches a gateway watching the other within 1 s;
* a second coordinator with a different signing key refuses to start;
* bad flags exit 2 naming the flag (the CLI's entry point, in this process).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from anex_agent import cli
from anex_agent.wire import keys
from anex_agent.client.rest import CoordinatorClient
from tests.coordinator.conftest import POSTGRES_URL, backend_url
from tests.coordinator.coordinator_process import CoordinatorProcess
from tests.polling import GENEROUS, scaled

ROOT = Path(__file__).resolve().parents[2]
ADMIN = "anexadm_test_admin_token_for_process_tests"
needs_postgres = pytest.mark.skipif(not POSTGRES_URL, reason="ANEX_TEST_POSTGRES_URL is not set (needs PostgreSQL)")


def Proc(args: list[str], cwd: Path, env: dict | None = None) -> CoordinatorProcess:
    return CoordinatorProcess(args, cwd=cwd, env={**os.environ, "ANEX_ADMIN_TOKEN": ADMIN, **(env or {})})


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.load(resp)


def test_starts_with_no_arguments_and_serves_openapi(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("ANEX_STATE_DIR", "ANEX_DATABASE_URL", "ANEX_ADMIN_TOKEN")}
    popen = subprocess.Popen([sys.executable, "-m", "anex_agent", "coordinator"], cwd=tmp_path,
                             env={**env, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        line = popen.stdout.readline()
        if not line:
            err = popen.stderr.read()
            if "8700" in err and "cannot listen" in err:
                pytest.skip("port 8700 is in use on this machine")
            raise AssertionError(err)
        assert "http://127.0.0.1:8700" in line
        doc = get_json("http://127.0.0.1:8700/v1/openapi.json")
        assert "/v1/nodes" in doc["paths"]
        token_file = tmp_path / "state" / "coordinator" / "admin-token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        assert (tmp_path / "state" / "coordinator" / "coordinator.db").exists()
    finally:
        popen.send_signal(signal.SIGTERM)
        popen.wait(15)
        stderr = popen.stderr.read()
    assert str(Path("state") / "coordinator" / "admin-token") in stderr  # the log says where the token is


@pytest.mark.parametrize("flags, words", [
    (["--network", "10.0.0.0/31"], "--network"),
    (["--listen", "nowhere"], "--listen"),
    (["--database", "mysql://x"], "--database"),
    (["--not-ready-after", "5", "--heartbeat-interval", "10"], "not-ready-after"),
    (["--mtu", "100"], "--mtu"),
    (["--address-quarantine", "nan"], "--address-quarantine"),
    (["--credential-rotation", "5"], "--credential-rotation"),
    (["--credential-grace", "nan"], "--credential-grace"),
    (["--gateway-gone-after", "1"], "--gateway-gone-after"),
    (["--gateway-gone-after", "nan"], "--gateway-gone-after"),
])
def test_bad_flags_exit_2_naming_the_flag(tmp_path, flags, words, capsys):
    """The CLI's entry point in this process (``python -m anex_agent`` exits with what it returns;
    test_cli_secrets_tls.py checks a real process's exit 2 and its one line): flag checks need
    no interpreter of their own."""
    status = cli.main(["coordinator", "--state-dir", str(tmp_path), *flags])
    stderr = capsys.readouterr().err
    assert status == 2
    assert words in stderr and "Traceback" not in stderr


@pytest.fixture
async def pg_database():
    if not POSTGRES_URL:
        pytest.skip("ANEX_TEST_POSTGRES_URL is not set (needs PostgreSQL)")
    async with backend_url("postgresql") as url:
        yield url


@pytest.fixture
def two_coordinators(tmp_path, pg_database):
    key_file = tmp_path / "signing-key"
    procs = []
    for i in range(2):
        state = tmp_path / f"c{i}"
        procs.append(Proc(["--listen", "127.0.0.1:0", "--state-dir", str(state), "--database", pg_database,
                           "--signing-key-file", str(key_file),
                           "--coordinator-key-file", str(tmp_path / "coordinator-key"),
                           "--ssh-ca-key-file", str(tmp_path / "ssh-ca-key")], cwd=tmp_path))
        procs[-1].wait_listening()  # one after the other: the first creates the shared key file
    yield procs
    for p in procs:
        p.stop()


@needs_postgres
@pytest.mark.slow
async def test_200_concurrent_joins_on_two_coordinators_get_distinct_addresses(two_coordinators):
    a, b = two_coordinators
    async with CoordinatorClient(a.url, admin_token=ADMIN) as admin:
        token = await admin.create_join_token(reusable=True, expires_in=600)

        async def join(i: int):
            url = (a.url, b.url)[i % 2]
            # 200 joins at once on a busy machine: each may wait long for its answer (the deadline
            # is for the answer, not a measure); a join that timed out and was sent again could
            # find itself already done
            async with CoordinatorClient(url, timeout=scaled(180.0)) as client:
                pair = keys.KeyPair(keys.generate_private_key())
                for attempt in range(5):
                    try:
                        return await client.join(token.token, pair, f"race-{i}", "other")
                    except Exception as err:  # only a retryable error may happen; prove it below
                        if not getattr(err, "retryable", False) or attempt == 4:
                            raise
                        await asyncio.sleep(0.1)

        results = await asyncio.gather(*(join(i) for i in range(200)))
        addresses = [r.config.address for r in results]
        assert len(set(addresses)) == 200
        listed = await admin.list_nodes()
    assert len(listed.nodes) == 200
    assert len({n.address for n in listed.nodes}) == 200
    assert sorted(n.address for n in listed.nodes) == sorted(addresses)


@needs_postgres
async def test_join_on_one_coordinator_reaches_a_gateway_watching_the_other(two_coordinators):
    a, b = two_coordinators
    async with CoordinatorClient(a.url, admin_token=ADMIN) as admin, CoordinatorClient(b.url) as gw:
        gw_token = await admin.create_join_token("gateway")
        node_token = await admin.create_join_token()
        await gw.register_gateway(gw_token.token, keys.KeyPair(keys.generate_private_key()), "gw")
        stream = gw.watch(0)
        assert (await asyncio.wait_for(anext(stream), 5)).type == "snapshot"
        pair = keys.KeyPair(keys.generate_private_key())
        async with CoordinatorClient(a.url) as node:
            joined = await node.join(node_token.token, pair, "far", "runpod")
        # the join has committed when its response arrives; the event must follow (NOTIFY, or the poll)
        event = await asyncio.wait_for(anext(stream), GENEROUS)
        assert event.type == "peer_added" and event.peer.node_id == joined.node_id
        # and a config push through B reaches the node watching A
        async with CoordinatorClient(a.url, credential=joined.credential) as node, \
                CoordinatorClient(b.url, admin_token=ADMIN) as admin_b:
            node_stream = node.watch(joined.config.version)
            await asyncio.sleep(0.3)
            from anex_agent.wire.nodes import TunnelSpec

            await admin_b.put_tunnels(joined.node_id, [TunnelSpec(listen_port=9000, target="svc:9000")])
            pushed = await asyncio.wait_for(anext(node_stream), GENEROUS)
            assert pushed.type == "config" and pushed.config.tunnels[0].listen_port == 9000
            await node_stream.aclose()
        await stream.aclose()


@needs_postgres
def test_second_coordinator_with_another_signing_key_refuses_to_start(tmp_path, pg_database):
    first = Proc(["--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "a"), "--database", pg_database],
                 cwd=tmp_path)
    try:
        first.wait_listening()
        out = subprocess.run(
            [sys.executable, "-m", "anex_agent", "coordinator", "--listen", "127.0.0.1:0",
             "--state-dir", str(tmp_path / "b"), "--database", pg_database],
            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT), "ANEX_ADMIN_TOKEN": ADMIN},
            capture_output=True, text=True, timeout=30,
        )
    finally:
        first.stop()
    assert out.returncode == 2
    assert "signing key differs" in out.stderr and "access-token-signing-key" in out.stderr


@needs_postgres
def test_second_coordinator_with_another_coordinator_key_refuses_to_start(tmp_path, pg_database):
    args = ["--listen", "127.0.0.1:0", "--database", pg_database, "--signing-key-file", str(tmp_path / "signing")]
    first = Proc([*args, "--state-dir", str(tmp_path / "a")], cwd=tmp_path)
    try:
        first.wait_listening()
        out = subprocess.run(
            [sys.executable, "-m", "anex_agent", "coordinator", *args, "--state-dir", str(tmp_path / "b")],
            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT), "ANEX_ADMIN_TOKEN": ADMIN},
            capture_output=True, text=True, timeout=30,
        )
    finally:
        first.stop()
    assert out.returncode == 2
    assert "coordinator key differs" in out.stderr and str(tmp_path / "b" / "coordinator-key") in out.stderr


async def test_buffered_heartbeats_survive_a_clean_shutdown(tmp_path):
    """SIGTERM flushes the heartbeat batch: an acknowledged heartbeat is in the database afterwards."""
    args = ["--listen", "127.0.0.1:0", "--state-dir", str(tmp_path), "--heartbeat-flush-interval", "5"]
    from anex_agent.wire.heartbeat import Heartbeat, NodeState, TransportStatus

    proc = Proc(args, cwd=tmp_path)
    try:
        url = proc.wait_listening()
        async with CoordinatorClient(url, admin_token=ADMIN) as admin, CoordinatorClient(url) as node:
            token = await admin.create_join_token()
            joined = await node.join(token.token, keys.KeyPair(keys.generate_private_key()), "n", "other")
            ack = await node.heartbeat(joined.node_id, Heartbeat(
                status=TransportStatus(engine="kernel", rx_bytes=4242), telemetry={"marker": 7}))
            assert ack.state == NodeState.ready
    finally:
        proc.stop()  # SIGTERM well within the 5 s flush interval
    assert proc.popen.returncode == 0
    proc = Proc(args, cwd=tmp_path)
    try:
        url = proc.wait_listening()
        async with CoordinatorClient(url, admin_token=ADMIN) as admin:
            view = await admin.get_node(joined.node_id)
            telemetry = await admin.get_telemetry(joined.node_id)
    finally:
        proc.stop()
    assert view.status is not None and view.status.rx_bytes == 4242 and view.last_heartbeat_at is not None
    assert telemetry.telemetry == {"marker": 7}
