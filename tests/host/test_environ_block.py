"""The agent's start-up environment block (/proc/<pid>/environ) loses its secrets, as another process reads it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from anex_agent.host.environ_block import environ_bounds

pytestmark = pytest.mark.skipif(environ_bounds() is None, reason="needs Linux /proc with the environment's bounds")

CHILD = (
    "import os, sys\n"
    "from anex_agent.host import childenv\n"
    "childenv.take_out_of_process_environ(os.environ)\n"
    "print(os.environ.get('ANEX_JOIN_TOKEN'), flush=True)\n"  # the settings still read it from the copy
    "sys.stdin.readline()\n"
)


def test_a_secret_is_gone_from_proc_environ_and_harmless_names_stay():
    env = {"PATH": "/usr/bin:/bin", "ANEX_JOIN_TOKEN": "anexjt_secret-join-token", "ANEX_PROXY_AUTH": "u:pw-secret",
           "ANEX_NODE_NAME": "gpu-1", "GW_TUNNEL_5432": "db:5432", "PYTHONPATH": str(Path.cwd())}
    child = subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "anexjt_secret-join-token"
        raw = Path(f"/proc/{child.pid}/environ").read_bytes()  # what another process (a root workload) sees
    finally:
        child.communicate("\n", timeout=30)
    assert b"secret" not in raw and b"pw-secret" not in raw
    entries = [e for e in raw.split(b"\0") if e]
    assert b"ANEX_JOIN_TOKEN=" in entries and b"ANEX_PROXY_AUTH=" in entries  # the names, with no value
    assert b"ANEX_NODE_NAME=gpu-1" in entries and b"GW_TUNNEL_5432=db:5432" in entries and b"PATH=/usr/bin:/bin" in entries
