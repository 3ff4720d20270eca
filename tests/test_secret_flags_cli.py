"""Real ``anex-agent`` processes: a secret on the command line warns, its file twin does not;
an empty file and a public plain-http coordinator are refused naming the flag.

Each command ends at a ConfigError (exit 2) placed after the secret and URL checks, so no
process here opens a connection.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith(("ANEX_", "GW_TUNNEL_"))}, "PYTHONPATH": str(ROOT)}


def anex(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "anex_agent", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**ENV, **(env or {})})


def test_gateway_token_on_the_command_line_warns(tmp_path):
    out = anex("gateway", "--coordinator", "http://127.0.0.1:1", "--token", "gw-S3CRET", "--listen-udp", "bad")
    assert out.returncode == 2 and "--listen-udp" in out.stderr
    assert "--token on the command line is visible to every user" in out.stderr and "--token-file" in out.stderr
    assert "gw-S3CRET" not in out.stderr


def test_gateway_token_file_does_not_warn_and_empty_is_refused(tmp_path):
    (tmp_path / "t").write_text("gw-S3CRET\n")
    out = anex("gateway", "--coordinator", "http://127.0.0.1:1", "--token-file", str(tmp_path / "t"), "--listen-udp", "bad")
    assert out.returncode == 2 and "--listen-udp" in out.stderr and "command line" not in out.stderr
    (tmp_path / "e").write_text("\n")
    out = anex("gateway", "--coordinator", "http://127.0.0.1:1", "--token-file", str(tmp_path / "e"))
    assert out.returncode == 2 and "--token-file" in out.stderr and "empty" in out.stderr
    out = anex("gateway", "--coordinator", "http://127.0.0.1:1", "--listen-udp", "bad",
               env={"ANEX_GATEWAY_TOKEN_FILE": str(tmp_path / "e")})
    assert out.returncode == 2 and "ANEX_GATEWAY_TOKEN_FILE" in out.stderr


def test_gateway_refuses_a_public_plain_http_coordinator(tmp_path):
    (tmp_path / "t").write_text("gw\n")
    out = anex("gateway", "--coordinator", "http://8.8.8.8:8700", "--token-file", str(tmp_path / "t"))
    assert out.returncode == 2 and "--coordinator" in out.stderr and "--allow-insecure" in out.stderr
    out = anex("gateway", "--coordinator", "http://8.8.8.8:8700", "--token-file", str(tmp_path / "t"),
               "--allow-insecure", "--listen-udp", "bad")
    assert out.returncode == 2 and "--listen-udp" in out.stderr and "clear text" in out.stderr


def test_agent_token_flag_warns_and_file_twins_work(tmp_path):
    base = ["daemon", "--coordinator", "http://127.0.0.1:1", "--state-dir", str(tmp_path), "--proxy-listen", "bad"]
    out = anex(*base, "--token", "join-S3CRET", "--proxy-auth", "u:pr0xy-S3CRET")
    assert out.returncode == 2 and "--proxy-listen" in out.stderr
    assert "--token on the command line" in out.stderr and "--token-file" in out.stderr
    assert "--proxy-auth-file" in out.stderr and "S3CRET" not in out.stderr
    (tmp_path / "t").write_text("join-S3CRET\n")
    out = anex(*base, "--token-file", str(tmp_path / "t"), env={"ANEX_PROXY_AUTH_FILE": str(tmp_path / "t2")})
    assert out.returncode == 2 and "ANEX_PROXY_AUTH_FILE" in out.stderr and "no such file" in out.stderr
    out = anex(*base, env={"ANEX_JOIN_TOKEN_FILE": str(tmp_path / "t")})
    assert out.returncode == 2 and "--proxy-listen" in out.stderr and "command line" not in out.stderr


def test_agent_refuses_a_public_plain_http_coordinator(tmp_path):
    out = anex("daemon", "--state-dir", str(tmp_path), env={"ANEX_COORDINATOR_URL": "http://8.8.8.8:8700"})
    assert out.returncode == 2 and "ANEX_COORDINATOR_URL" in out.stderr and "ANEX_ALLOW_INSECURE=1" in out.stderr


def test_admin_takes_the_admin_token_from_a_file_or_the_environment_never_the_command_line(tmp_path):
    out = anex("admin", "--coordinator", "http://127.0.0.1:1", "nodes", "list", "--token", "anexadm_S3CRET")
    assert out.returncode == 2 and "--token: the admin token is not taken on the command line" in out.stderr
    assert "S3CRET" not in out.stderr and "--token-file" in out.stderr
    (tmp_path / "e").write_text("\n")
    out = anex("admin", "--coordinator", "http://127.0.0.1:1", "nodes", "list", "--token-file", str(tmp_path / "e"))
    assert out.returncode == 2 and "--token-file" in out.stderr and "empty" in out.stderr
    out = anex("admin", "nodes", "list", env={"ANEX_COORDINATOR_URL": "http://127.0.0.1:1",
                                              "ANEX_ADMIN_TOKEN_FILE": str(tmp_path / "missing")})
    assert out.returncode == 2 and "ANEX_ADMIN_TOKEN_FILE" in out.stderr and "no such file" in out.stderr
    out = anex("admin", "nodes", "list", env={"ANEX_COORDINATOR_URL": "http://8.8.8.8:8700", "ANEX_ADMIN_TOKEN": "t"})
    assert out.returncode == 2 and "ANEX_COORDINATOR_URL" in out.stderr and "--allow-insecure" in out.stderr
