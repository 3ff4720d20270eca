"""Every flag that takes HOST:PORT, a port or a CIDR refuses the same things the same way.

Other scripts' digits ('²' passes ``str.isdigit``, '٣' and '３' pass ``int``), port 0 where
no free port is meant, 65536, an IPv6 address with a port but no brackets, a missing host
where one is needed: exit status 2 and one line naming the flag and the input, never a
traceback. The coordinator's ``--listen`` and the gateway's ``--listen-udp`` and
``--dns-upstream`` run as real processes; the other flags go through the same dispatcher
(:func:`anex_agent.cli.main`) in this process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from anex_agent import cli

ROOT = Path(__file__).resolve().parents[1]

ODD_DIGITS = ["²", "①", "٣", "３"]
BAD_PORTS = [*ODD_DIGITS, "0", "65536"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANEX_", "GW_TUNNEL_"))}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def _assert_one_line_naming(stderr: str, command: str, flag: str, value: str) -> None:
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"anex-agent {command}: {flag}: {value!r} must be "), lines[0]


# ---------------------------------------------------------------- real processes

PROCESS_CASES = (
    # the coordinator prints the address it serves, so port 0 (any free port) is allowed there
    [("coordinator", "--listen", f"127.0.0.1:{p}") for p in [*ODD_DIGITS, "65536"]]
    + [("coordinator", "--listen", v) for v in ["::1:8700", ":8700", "nowhere.example:8700", "[127.0.0.1]:8700"]]
    + [("gateway", "--listen-udp", f"0.0.0.0:{p}") for p in BAD_PORTS]
    + [("gateway", "--listen-udp", "fd00::1:51820")]
    + [("gateway", "--dns-upstream", f"10.96.0.10:{p}") for p in BAD_PORTS]
    + [("gateway", "--dns-upstream", v) for v in [":53", "kube-dns:53", "[10.96.0.10]:53"]]
)


def _run_case(command: str, flag: str, value: str, tmp_path: Path) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "anex_agent", command, flag, value]
    if command == "gateway":
        args += ["--coordinator", "http://127.0.0.1:9", "--state-dir", str(tmp_path)]
    else:
        args += ["--state-dir", str(tmp_path)]
    return subprocess.run(args, cwd=tmp_path, env=_env(ANEX_GATEWAY_TOKEN="t"), capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(scope="module")
def process_runs(tmp_path_factory):
    """Every case's process, four at a time from the first test on: they are independent, and each
    is mostly an interpreter starting up (one after the other they took most of this module's time)."""
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="flag-process") as pool:
        yield {case: pool.submit(_run_case, *case, tmp_path_factory.mktemp("flags")) for case in PROCESS_CASES}


@pytest.mark.parametrize("command, flag, value", PROCESS_CASES)
def test_process_exits_2_with_one_line_naming_the_flag(process_runs, command, flag, value):
    out = process_runs[(command, flag, value)].result()
    assert out.returncode == 2, out.stderr
    _assert_one_line_naming(out.stderr, command, flag, value)


def test_demo_service_listen_is_an_argparse_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "anex_agent.testing.services", "http", "--listen", "10.0.0.1:²"],
                         cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "argument --listen: '10.0.0.1:²' must be HOST:PORT" in out.stderr


# ---------------------------------------------------------------- the same dispatcher, in this process

AGENT = ["--coordinator", "http://127.0.0.1:9"]

IN_PROCESS_CASES = (
    [("daemon", "--proxy-listen", f"127.0.0.1:{p}") for p in BAD_PORTS]
    + [("daemon", "--proxy-listen", v) for v in ["::1:3128", ":3128", "proxy.example:3128"]]
    + [("run", "--api-listen", f"127.0.0.1:{p}") for p in BAD_PORTS]
    + [("run", "--api-listen", v) for v in ["::1:9555", ":9555"]]
    + [("gateway", "--endpoint", f"gw.example.com:{p}") for p in BAD_PORTS]
    + [("gateway", "--endpoint", v) for v in ["fd00::1:51820", ":51820"]]
    + [("gateway", "--route", f"10.96.0.0/{p}") for p in [*ODD_DIGITS, "33"]]
    + [("coordinator", "--network", f"10.254.0.0/{p}") for p in ODD_DIGITS]
)


@pytest.mark.parametrize("command, flag, value", IN_PROCESS_CASES)
def test_flag_exits_2_with_one_line_naming_the_flag(monkeypatch, capsys, tmp_path, command, flag, value):
    for name in list(os.environ):
        if name.startswith(("ANEX_", "GW_TUNNEL_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("ANEX_JOIN_TOKEN", "t")
    monkeypatch.setenv("ANEX_GATEWAY_TOKEN", "t")
    argv = [command, flag, value, "--state-dir", str(tmp_path)]
    if command in ("run", "daemon"):
        argv += AGENT + (["--", "true"] if command == "run" else [])
    elif command == "gateway":
        argv += ["--coordinator", "http://127.0.0.1:9"]
    assert cli.main(argv) == 2
    _assert_one_line_naming(capsys.readouterr().err, command, flag, value)


@pytest.mark.parametrize("value", BAD_PORTS)
def test_agent_port_lists_and_tunnels_name_the_flag(monkeypatch, capsys, tmp_path, value):
    for name in list(os.environ):
        if name.startswith(("ANEX_", "GW_TUNNEL_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("ANEX_JOIN_TOKEN", "t")
    base = ["daemon", "--state-dir", str(tmp_path), *AGENT]
    for extra, flag in ((["--inbound-ports", f"8000,{value}"], "--inbound-ports"),
                        (["--tunnel", f"5432=db.default.svc:{value}"], "--tunnel"),
                        (["--tunnel", f"{value}=db.default.svc:5432"], "--tunnel")):
        assert cli.main(base + extra) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
        assert err.startswith(f"anex-agent daemon: {flag}: "), err
