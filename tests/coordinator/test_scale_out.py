"""Several coordinator processes behind one address (``--reuse-port``) on one PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys

import pytest

from anex_agent.wire import keys
from anex_agent.wire.heartbeat import Heartbeat, NodeState
from anex_agent.client.rest import CoordinatorClient
from tests.coordinator.conftest import POSTGRES_URL, backend_url
from tests.coordinator.coordinator_process import CoordinatorProcess

ADMIN = "anexadm_test_admin_token_for_scale_out_tests"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def pg_database():
    if not POSTGRES_URL:
        pytest.skip("ANEX_TEST_POSTGRES_URL is not set (needs PostgreSQL)")
    async with backend_url("postgresql") as url:
        yield url


def start(tmp_path, name: str, database: str, port: int, *extra: str) -> CoordinatorProcess:
    return CoordinatorProcess(
        ["--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path / name), "--database", database,
         "--signing-key-file", str(tmp_path / "signing-key"), "--coordinator-key-file", str(tmp_path / "coordinator-key"),
         "--ssh-ca-key-file", str(tmp_path / "ssh-ca-key"), *extra],
        env={**os.environ, "ANEX_ADMIN_TOKEN": ADMIN},
    )


async def test_two_coordinators_share_one_port_with_reuse_port(tmp_path, pg_database):
    port = free_port()
    procs = []
    try:
        for name in ("a", "b"):  # one after the other: the first creates the shared key files
            procs.append(start(tmp_path, name, pg_database, port, "--reuse-port"))
            assert procs[-1].wait_listening() == f"http://127.0.0.1:{port}"
        url = f"http://127.0.0.1:{port}"
        async with CoordinatorClient(url, admin_token=ADMIN) as admin:
            token = await admin.create_join_token(reusable=True, expires_in=600)
        # many fresh connections: the kernel spreads them over both processes, and every one
        # of them knows every node (credential caches filled from the database and the feed)
        pair = keys.KeyPair(keys.generate_private_key())
        async with CoordinatorClient(url) as client:
            joined = await client.join(token.token, pair, "n", "other")
        for _ in range(20):
            async with CoordinatorClient(url, credential=joined.credential) as node:
                ack = await node.heartbeat(joined.node_id, Heartbeat())
                assert ack.state == NodeState.ready
        for proc in procs:
            assert "Traceback" not in proc.stop()
    finally:
        for proc in procs:
            proc.stop()


async def test_a_second_coordinator_on_a_taken_port_without_reuse_port_exits_naming_listen(tmp_path, pg_database):
    port = free_port()
    first = start(tmp_path, "a", pg_database, port, "--reuse-port")
    try:
        first.wait_listening()
        out = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "anex_agent", "coordinator", "--listen", f"127.0.0.1:{port}",
             "--state-dir", str(tmp_path / "b"), "--database", pg_database,
             "--signing-key-file", str(tmp_path / "signing-key"),
             "--coordinator-key-file", str(tmp_path / "coordinator-key"),
             "--ssh-ca-key-file", str(tmp_path / "ssh-ca-key")],
            capture_output=True, text=True, timeout=60, env={**os.environ, "ANEX_ADMIN_TOKEN": ADMIN},
        )
        assert out.returncode == 2 and "--listen" in out.stderr
    finally:
        first.stop()
