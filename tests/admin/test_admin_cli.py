"""``anex-agent admin`` end to end against a real coordinator process on 127.0.0.1.

One coordinator for the module (started as users start it, with provisioning switched on and
no provider configured); each test drives the CLI's entry point (:func:`anex_agent.cli.main`,
as the ``anex-agent`` script does) and reads what it printed: tables with their columns,
``-o json`` parsed, errors as one line naming the input. Nodes and gateways join with
tokens the CLI created, through the coordinator client as agents and gateways do.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from anex_agent import cli
from anex_agent.wire import keys
from anex_agent.client.rest import CoordinatorClient
from tests.coordinator.coordinator_process import CoordinatorProcess

ROOT = Path(__file__).resolve().parents[2]
ADMIN = "anexadm_admin_cli_test_token_0123456789abcdef"
CLEAN = {k: v for k, v in os.environ.items() if not k.startswith(("ANEX_", "GW_TUNNEL_"))}


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory):
    state = tmp_path_factory.mktemp("admin-cli")
    proc = CoordinatorProcess(["--listen", "127.0.0.1:0", "--state-dir", str(state / "state"),
                               "--heartbeat-flush-interval", "0"],
                              env={**CLEAN, "ANEX_ADMIN_TOKEN": ADMIN,
                                   "ANEX_PROVISION_COORDINATOR_URL": "http://coordinator.invalid:8700"})
    try:
        yield proc.wait_listening()
    finally:
        proc.stop()


@pytest.fixture
def admin(coordinator, monkeypatch, capsys):
    """``admin("nodes", "list", ...)`` -> (exit status, stdout, stderr), with the admin settings in the environment."""
    for name in [k for k in os.environ if k.startswith("ANEX_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("ANEX_COORDINATOR_URL", coordinator)
    monkeypatch.setenv("ANEX_ADMIN_TOKEN", ADMIN)

    def run(*argv: str) -> tuple[int, str, str]:
        status = cli.main(["admin", *argv])
        out = capsys.readouterr()
        return status, out.out, out.err

    return run


def admin_json(admin, *argv: str):
    status, out, err = admin(*argv, "-o", "json")
    assert status == 0, err
    return json.loads(out)


def columns(out: str) -> list[str]:
    return [c.strip() for c in out.splitlines()[0].split("  ") if c.strip()]


async def _join(url: str, token: str, name: str) -> str:
    async with CoordinatorClient(url) as client:
        joined = await client.join(token, keys.KeyPair(keys.generate_private_key()), name, "onprem")
        return joined.node_id


async def _register(url: str, token: str, name: str) -> str:
    async with CoordinatorClient(url) as client:
        registered = await client.register_gateway(token, keys.KeyPair(keys.generate_private_key()), name,
                                                   endpoint="192.0.2.1:51820")
        return registered.gateway_id


# ---------------------------------------------------------------- tokens


def test_tokens_create_list_show_delete(admin, tmp_path):
    status, out, err = admin("tokens", "create", "--kind", "gateway", "--ttl", "2h")
    assert status == 0, err
    fields = dict(line.split(None, 1) for line in out.splitlines() if line and not line.startswith("("))
    assert fields["kind"] == "gateway" and fields["token"].startswith("anexjt_") and fields["max_uses"] == "1"
    assert "shown only this once" in out
    created = admin_json(admin, "tokens", "create", "--reusable", "--label", "team=ml", "--provider", "vastai",
                         "--ttl", "7d")
    assert created["token"].startswith("anexjt_") and created["reusable"] is True and created["max_uses"] is None
    assert created["labels"] == {"team": "ml"} and created["providers"] == ["vastai"]

    status, out, _ = admin("tokens", "list")
    assert status == 0 and columns(out) == ["ID", "KIND", "USES", "PROVIDERS", "LABELS", "CREATED", "EXPIRES",
                                            "USED BY"]
    row = next(line for line in out.splitlines() if line.startswith(created["id"]))
    assert "0/unlimited" in row and "vastai" in row and "team=ml" in row
    assert "anexjt_" not in out  # the list never shows a secret
    listed = admin_json(admin, "tokens", "list")
    assert created["id"] in [t["id"] for t in listed["tokens"]] and "anexjt_" not in json.dumps(listed)
    shown = admin_json(admin, "tokens", "show", created["id"])
    assert shown["id"] == created["id"] and "token" not in shown

    out_file = tmp_path / "gw.token"
    status, out, err = admin("tokens", "create", "--kind", "gateway", "--out", str(out_file))
    assert status == 0, err
    assert "anexjt_" not in out and "gw.token" in out
    assert out_file.read_text().startswith("anexjt_") and out_file.stat().st_mode & 0o777 == 0o600

    status, out, _ = admin("tokens", "delete", created["id"])
    assert status == 0 and "revoked" in out
    assert created["id"] not in [t["id"] for t in admin_json(admin, "tokens", "list")["tokens"]]


def test_token_options_are_checked_naming_the_flag(admin):
    status, _, err = admin("tokens", "create", "--ttl", "5x")
    assert status == 2 and err.startswith("anex-agent admin: --ttl: '5x'") and "12h" in err
    status, _, err = admin("tokens", "create", "--kind", "gateway", "--provider", "vastai")
    assert status == 2 and "--provider:" in err  # the coordinator's 422 names providers: shown as the flag
    status, _, err = admin("tokens", "create", "--reusable", "--max-uses", "1")
    assert status == 2 and "--max-uses:" in err
    status, _, err = admin("tokens", "delete", "jt-000000000000")
    assert status == 2 and "TOKEN_ID: no join token 'jt-000000000000'" in err and "tokens list" in err
    assert len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------- nodes and gateways


def test_nodes_list_show_delete_by_id_and_name(admin, coordinator):
    token = admin_json(admin, "tokens", "create", "--reusable")["token"]
    node_id = asyncio.run(_join(coordinator, token, "web-1"))
    other = asyncio.run(_join(coordinator, token, "web-2"))

    status, out, _ = admin("nodes", "list")
    assert status == 0 and columns(out) == ["ID", "NAME", "PROVIDER", "STATE", "HEALTH", "ADDRESS", "PATH",
                                            "LAST HEARTBEAT"]
    assert any(line.startswith(node_id) and "web-1" in line and "onprem" in line for line in out.splitlines())
    listed = admin_json(admin, "nodes", "list")
    assert {node_id, other} <= {n["id"] for n in listed["nodes"]}
    by_name = admin_json(admin, "nodes", "show", "web-1")
    assert by_name["id"] == node_id and by_name == admin_json(admin, "nodes", "show", node_id)
    status, out, _ = admin("nodes", "show", "web-1")
    assert status == 0 and any(line.split() == ["name", "web-1"] for line in out.splitlines())

    status, out, _ = admin("nodes", "delete", "web-2")
    assert status == 0 and other in out
    assert other not in {n["id"] for n in admin_json(admin, "nodes", "list")["nodes"]}
    status, _, err = admin("nodes", "show", "web-2")
    assert status == 2 and "NODE: no node 'web-2'; see anex-agent admin nodes list" in err
    status, _, err = admin("nodes", "delete", "n-000000000000")
    assert status == 2 and "no node 'n-000000000000'" in err


def test_gateways_list_show_delete(admin, coordinator):
    token = admin_json(admin, "tokens", "create", "--kind", "gateway")["token"]
    gateway_id = asyncio.run(_register(coordinator, token, "gw-east"))
    status, out, _ = admin("gateways", "list")
    assert status == 0 and columns(out) == ["ID", "NAME", "ADDRESS", "ENDPOINT", "RELAY", "ROUTES", "LAST SEEN"]
    assert any(line.startswith(gateway_id) and "192.0.2.1:51820" in line for line in out.splitlines())
    assert admin_json(admin, "gateways", "show", "gw-east")["id"] == gateway_id
    status, out, _ = admin("gateways", "delete", gateway_id)
    assert status == 0 and gateway_id in out
    assert gateway_id not in {g["id"] for g in admin_json(admin, "gateways", "list")["gateways"]}
    status, _, err = admin("gateways", "show", gateway_id)
    assert status == 2 and f"GATEWAY: no gateway {gateway_id!r}" in err


# ---------------------------------------------------------------- provisions and bans


def test_provisions_create_from_a_file_and_flags_list_show_delete(admin, tmp_path):
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({"name": "from-file", "image": "img:1", "command": ["sleep", "1"],
                                "annotations": {"anex.sh/gpu-count": "1"}}))
    made = admin_json(admin, "provisions", "create", "--file", str(spec), "--env", "A=1")
    assert made["name"] == "from-file" and made["id"].startswith("pv-")
    assert made["annotations"] == {"anex.sh/gpu-count": "1"}
    status, out, err = admin("provisions", "create", "--name", "from-flags", "--image", "img:2",
                             "--annotation", "anex.sh/gpu-count=1", "--", "python", "train.py")
    assert status == 0, err
    assert any(line.split() == ["name", "from-flags"] for line in out.splitlines())

    status, out, _ = admin("provisions", "list")
    assert status == 0 and columns(out) == ["ID", "NAME", "STATE", "PROVIDER", "NODE", "USD/H", "COST USD", "REASON"]
    assert any(made["id"] in line and "from-file" in line for line in out.splitlines())
    assert admin_json(admin, "provisions", "show", "from-file")["id"] == made["id"]
    assert admin_json(admin, "provisions", "show", made["id"])["name"] == "from-file"

    status, out, _ = admin("provisions", "delete", "from-flags")
    assert status == 0 and "from-flags" in out and ("deleting" in out or "deleted" in out)
    flags_id = next(line.split()[1] for line in out.splitlines() if line.startswith("provision "))
    assert admin_json(admin, "provisions", "show", flags_id)["state"] in ("deleting", "deleted")
    status, _, err = admin("provisions", "create", "--image", "x")
    assert status == 2 and "--name: is required" in err
    status, _, err = admin("provisions", "create", "--name", "Bad Name", "--image", "x")
    assert status == 2 and err.startswith("anex-agent admin: --name:")
    (tmp_path / "env.json").write_text(json.dumps({"name": "bad-env", "image": "x", "env": {"ANEX_JOIN_TOKEN": "t"}}))
    status, _, err = admin("provisions", "create", "--file", str(tmp_path / "env.json"))
    assert status == 2 and err.startswith("anex-agent admin: --file (env): ANEX_JOIN_TOKEN: set by the coordinator")
    status, _, err = admin("provisions", "create", "--name", "bad-env", "--image", "x", "--env", "ANEX_JOIN_TOKEN=t")
    assert status == 2 and err.startswith("anex-agent admin: --env: ANEX_JOIN_TOKEN: set by the coordinator")
    (tmp_path / "bad.json").write_text("[1, 2")
    status, _, err = admin("provisions", "create", "--file", str(tmp_path / "bad.json"))
    assert status == 2 and "--file:" in err and "not JSON" in err
    status, _, err = admin("provisions", "show", "pv-000000000000")
    assert status == 2 and "PROVISION: no provision 'pv-000000000000'" in err


def test_bans_create_list_show_delete(admin):
    ban = admin_json(admin, "bans", "create", "4242", "--reason", "flaky GPU", "--duration", "1d")
    assert ban["machine_id"] == "4242" and ban["reason"] == "flaky GPU"
    assert ban["expires_at"] - ban["created_at"] == pytest.approx(86400, abs=1)
    status, out, _ = admin("bans", "list")
    assert status == 0 and columns(out) == ["MACHINE", "PROVIDER", "CREATED", "EXPIRES", "REASON"]
    assert any(line.startswith("4242") and "flaky GPU" in line for line in out.splitlines())
    assert admin_json(admin, "bans", "show", "4242")["reason"] == "flaky GPU"
    status, out, _ = admin("bans", "delete", "4242")
    assert status == 0 and "lifted" in out
    status, _, err = admin("bans", "delete", "4242")
    assert status == 2 and "MACHINE_ID: no active ban of machine '4242'" in err


# ---------------------------------------------------------------- settings and failures


def test_a_refused_token_names_where_it_was_read(admin, monkeypatch, tmp_path):
    monkeypatch.delenv("ANEX_ADMIN_TOKEN")
    wrong = tmp_path / "admin-token"
    wrong.write_text("anexadm_not_the_right_one\n")
    status, out, err = admin("nodes", "list", "--token-file", str(wrong))
    assert status == 2 and out == ""
    assert err.startswith("anex-agent admin: --token-file: the coordinator at http://127.0.0.1:") and "401" in err
    monkeypatch.setenv("ANEX_ADMIN_TOKEN_FILE", str(wrong))
    status, _, err = admin("tokens", "list")
    assert status == 2 and "ANEX_ADMIN_TOKEN_FILE: the coordinator" in err and "anexadm_not" not in err
    monkeypatch.delenv("ANEX_ADMIN_TOKEN_FILE")
    status, _, err = admin("nodes", "list")
    assert status == 2 and "ANEX_ADMIN_TOKEN: is not set" in err and "--token-file" in err


def test_an_unreachable_coordinator_is_named(admin, monkeypatch):
    status, _, err = admin("nodes", "list", "--coordinator", "http://127.0.0.1:1")
    assert status == 1 and err.startswith(
        "anex-agent admin: cannot reach the coordinator at http://127.0.0.1:1 (from --coordinator): ")
    monkeypatch.delenv("ANEX_COORDINATOR_URL")
    status, _, err = admin("nodes", "list")
    assert status == 2 and "ANEX_COORDINATOR_URL: is not set" in err
    status, _, err = admin("nodes", "list", "--coordinator", "http://8.8.8.8:8700")
    assert status == 2 and "--coordinator:" in err and "--allow-insecure" in err


def test_the_token_is_never_taken_from_the_command_line(coordinator):
    """A real ``anex-agent admin`` process: ``--token`` is refused without echoing it; the
    environment works; the options may come before or after RESOURCE VERB."""
    env = {**CLEAN, "PYTHONPATH": str(ROOT)}

    def anex(*argv: str, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "anex_agent", "admin", *argv], capture_output=True, text=True,
                              timeout=60, env={**env, **extra}, cwd=ROOT)

    out = anex("--coordinator", coordinator, "nodes", "list", "--token", "anexadm_S3CRET")
    assert out.returncode == 2 and "--token: the admin token is not taken on the command line" in out.stderr
    assert "S3CRET" not in out.stderr + out.stdout and "--token-file" in out.stderr
    out = anex("--json", "bans", "list", "--coordinator", coordinator, ANEX_ADMIN_TOKEN=ADMIN)
    assert out.returncode == 0, out.stderr
    assert "bans" in json.loads(out.stdout)
