"""Bootstrap: the provision-bound single-use join token, the agent download route, and the start
script run for real (curl, wget, and bash's /dev/tcp) against a coordinator, with hostile argv
and a tampered agent file."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import shutil
import stat
import subprocess
from pathlib import Path

import aiohttp
import pytest

from anex_agent.wire import keys
from anex_agent.coordinator.provisioning import bootstrap
from anex_agent.coordinator.routes import agent_download
from anex_agent.errors import CoordinatorError
from tests.coordinator.conftest import start_harness, stop_harness
from tests.coordinator.coordinator_process import CoordinatorProcess

ARCH = os.uname().machine
# an "agent" that records how it was started: argv (NUL-separated), environment, and the token file
FAKE_AGENT = """#!/bin/sh
out=$(dirname "$0")/record
printf '%s\\0' "$@" > "$out.argv"
env > "$out.env"
cat "$ANEX_JOIN_TOKEN_FILE" > "$out.token"
echo FAKE-AGENT-RAN
"""
HOSTILE = ["python3", "it's", 'a "quoted" $HOME `id` $(id)', "semi;colon && ls", "new\nline", "back\\slash",
           "", " lead space", "*", "-e", "--", "ünï", "'", "'\\''"]


@pytest.fixture
def agent_file(tmp_path: Path) -> Path:
    path = tmp_path / "dist" / "anex-agent"
    path.parent.mkdir()
    path.write_text(FAKE_AGENT)
    path.chmod(0o755)
    return path


@pytest.fixture
async def coord(tmp_path: Path, database_url: str, clock, agent_file: Path):
    harness = await start_harness(tmp_path, database_url, clock, agent_binaries=((ARCH, agent_file),))
    try:
        yield harness
    finally:
        await stop_harness(harness)


async def _issue(coord, provision_id="pr-1", ttl=600.0, provider=None):
    now = coord.ctx.clock()
    async with coord.ctx.db.transaction() as tx:
        return await bootstrap.issue(tx, provision_id, expires_at=now + ttl, now=now, provider=provider)


async def _node_of(coord, provision_id="pr-1"):
    async with coord.ctx.db.transaction() as tx:
        return await bootstrap.node_of_provision(tx, provision_id)


# ---------------------------------------------------------------- the provision-bound token

async def test_a_provision_token_admits_one_node_and_names_the_provision(coord):
    creds = await _issue(coord, provider="vastai")
    assert "anexjt_" in creds.secret and creds.secret not in repr(creds)
    assert await _node_of(coord) is None
    pair = keys.KeyPair(keys.generate_private_key())
    joined = await coord.client().join(creds.secret, pair, "rented-1", "vastai")
    assert await _node_of(coord) == joined.node_id
    assert await _node_of(coord, "pr-other") is None
    node = await coord.admin.get_node(joined.node_id)
    assert node.labels[bootstrap.PROVISION_LABEL] == "pr-1"
    again = await coord.client().join(creds.secret, pair, "rented-1", "vastai")  # the same machine re-joins
    assert again.node_id == joined.node_id
    with pytest.raises(CoordinatorError) as info:  # single use: a second machine is refused
        await coord.client().join(creds.secret, keys.KeyPair(keys.generate_private_key()), "other", "vastai")
    assert info.value.status == 401
    tokens = (await coord.admin.list_join_tokens()).tokens
    token = next(t for t in tokens if t.id == creds.token_id)
    assert token.max_uses == 1 and token.uses == 1 and token.providers == ["vastai"]


async def test_a_provision_token_expires_with_the_boot_timeout_and_keeps_its_provider(coord):
    creds = await _issue(coord, ttl=60, provider="runpod")
    with pytest.raises(CoordinatorError) as info:
        await coord.client().join(creds.secret, keys.KeyPair(keys.generate_private_key()), "n", "vastai")
    assert info.value.status == 403
    coord.clock.advance(61)
    with pytest.raises(CoordinatorError) as info:
        await coord.client().join(creds.secret, keys.KeyPair(keys.generate_private_key()), "n", "runpod")
    assert info.value.status == 401
    assert await _node_of(coord) is None


async def test_issue_refuses_nonsense(coord):
    now = coord.ctx.clock()
    async with coord.ctx.db.transaction() as tx:
        with pytest.raises(ValueError):
            await bootstrap.issue(tx, "pr-1", expires_at=now, now=now)
        with pytest.raises(ValueError):
            await bootstrap.issue(tx, "", expires_at=now + 5, now=now)


def test_boot_env_has_what_the_agent_reads():
    env = bootstrap.boot_env("https://c.example:8700", "anexjt_x", provider="runpod", node_name="p1",
                             ca_file="/etc/ca.pem")
    assert env == {"ANEX_COORDINATOR_URL": "https://c.example:8700", "ANEX_JOIN_TOKEN": "anexjt_x",
                   "ANEX_PROVIDER": "runpod", "ANEX_NODE_NAME": "p1", "ANEX_CA_FILE": "/etc/ca.pem"}
    assert bootstrap.boot_env("http://c", "t") == {"ANEX_COORDINATOR_URL": "http://c", "ANEX_JOIN_TOKEN": "t"}


# ---------------------------------------------------------------- the download route

async def _get(url: str, token: str | None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as session:
        async with session.get(url, headers=headers) as resp:
            return resp.status, dict(resp.headers), await resp.read()


async def test_download_streams_the_agent_with_its_hash_and_does_not_use_the_token(coord, agent_file):
    creds = await _issue(coord)
    status, headers, body = await _get(f"{coord.url}/v1/agent/{ARCH}", creds.secret)
    assert status == 200 and body == agent_file.read_bytes()
    digest = hashlib.sha256(body)
    assert headers["X-Checksum-Sha256"] == digest.hexdigest()
    assert headers["Digest"] == "sha-256=" + base64.b64encode(digest.digest()).decode()
    assert headers["Content-Type"] == "application/octet-stream"
    assert await agent_download.agent_sha256(coord.ctx.settings, ARCH) == digest.hexdigest()
    await _get(f"{coord.url}/v1/agent/{ARCH}", creds.secret)
    joined = await coord.client().join(creds.secret, keys.KeyPair(keys.generate_private_key()), "n", "vastai")
    assert await _node_of(coord) == joined.node_id  # two downloads, and the join still had its use


async def test_download_needs_a_live_node_join_token(coord):
    url = f"{coord.url}/v1/agent/{ARCH}"
    gateway_token = (await coord.admin.create_join_token("gateway")).token
    for token in (None, "anexjt_unknown", coord.ctx.admin_token, gateway_token):
        status, headers, body = await _get(url, token)
        assert status == 401, token
        assert b"#!/bin/sh" not in body
    creds = await _issue(coord, ttl=30)
    coord.clock.advance(31)
    assert (await _get(url, creds.secret))[0] == 401


async def test_download_of_an_unknown_architecture_is_a_404_naming_it(coord):
    creds = await _issue(coord)
    status, _headers, body = await _get(f"{coord.url}/v1/agent/sparc64", creds.secret)
    assert status == 404 and b"sparc64" in body and ARCH.encode() in body and b'"arch"' in body


# ---------------------------------------------------------------- the start script, run for real

def _toolbox(tmp_path: Path, downloader: str) -> Path:
    """A PATH directory with the basic tools and only ``downloader`` (curl, wget, or bash) to fetch with."""
    box = tmp_path / f"bin-{downloader}"
    box.mkdir()
    tools = ["sh", "uname", "cat", "sha256sum", "cut", "mkdir", "rm", "chmod", "mv", "sleep", "env", "dirname", "sed"]
    for tool in tools + [downloader]:
        found = shutil.which(tool)
        assert found, tool
        (box / tool).symlink_to(found)
    return box


async def _run_script(script: str, box: Path, home: Path) -> tuple[int, str]:
    path = home / "start.sh"
    path.write_text(script)
    proc = await asyncio.create_subprocess_exec(
        str(box / "sh"), str(path), env={"PATH": str(box), "HOME": str(home), "ANEX_JOIN_TOKEN": "leaked"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(errors="replace")


@pytest.mark.parametrize("downloader", ["curl", "wget", "bash"])
async def test_start_script_downloads_checks_and_execs_any_argv(coord, agent_file, tmp_path, downloader):
    if not shutil.which(downloader):
        pytest.skip(f"{downloader} is not installed")
    creds = await _issue(coord)
    sha = await agent_download.agent_sha256(coord.ctx.settings, ARCH)
    state = tmp_path / f"state {downloader}"  # a space in the path, too
    script = bootstrap.start_script(coord.url, creds.secret, sha, HOSTILE, state_dir=str(state),
                                    env={"ANEX_PROVIDER": "vastai", "ANEX_NODE_NAME": "it's me"})
    code, out = await _run_script(script, _toolbox(tmp_path, downloader), tmp_path)
    assert code == 0 and "FAKE-AGENT-RAN" in out, out
    argv = (state / "record.argv").read_bytes().split(b"\0")[:-1]
    assert [a.decode() for a in argv] == ["run", "--", *HOSTILE]
    env = dict(line.split("=", 1) for line in (state / "record.env").read_text().splitlines() if "=" in line)
    assert env["ANEX_COORDINATOR_URL"] == coord.url and env["ANEX_STATE_DIR"] == str(state)
    assert env["ANEX_PROVIDER"] == "vastai" and env["ANEX_NODE_NAME"] == "it's me"
    assert "ANEX_JOIN_TOKEN" not in env  # only the 0600 file holds it
    assert (state / "record.token").read_text().strip() == creds.secret
    assert stat.S_IMODE((state / "join-token").stat().st_mode) == 0o600
    assert creds.secret not in out


async def test_start_script_refuses_a_tampered_agent_and_runs_nothing(coord, agent_file, tmp_path):
    creds = await _issue(coord)
    sha = await agent_download.agent_sha256(coord.ctx.settings, ARCH)
    agent_file.write_text(FAKE_AGENT.replace("FAKE-AGENT-RAN", "TAMPERED-AGENT-RAN") + "# evil\n")
    state = tmp_path / "state"
    script = bootstrap.start_script(coord.url, creds.secret, sha, ["true"], state_dir=str(state))
    code, out = await _run_script(script, _toolbox(tmp_path, "curl"), tmp_path)
    assert code == 1, out
    assert "checksum mismatch" in out and "refusing to run it" in out
    assert "RAN" not in out.replace("refusing to run it", "")
    assert not (state / "anex-agent").exists() and not (state / "anex-agent.part").exists()
    assert not (state / "record.argv").exists()


async def test_start_script_keeps_a_checked_copy_and_does_not_download_again(coord, agent_file, tmp_path):
    creds = await _issue(coord)
    sha = await agent_download.agent_sha256(coord.ctx.settings, ARCH)
    state = tmp_path / "state"
    script = bootstrap.start_script(coord.url, creds.secret, sha, ["x"], state_dir=str(state))
    box = _toolbox(tmp_path, "curl")
    assert (await _run_script(script, box, tmp_path))[0] == 0
    agent_file.unlink()  # the coordinator could not serve it any more: the kept copy is used
    code, out = await _run_script(script, box, tmp_path)
    assert code == 0 and "FAKE-AGENT-RAN" in out, out


def test_start_script_refuses_bad_input():
    sha = "0" * 64
    with pytest.raises(ValueError):
        bootstrap.start_script("http://c", "t", "ABC", ["x"])
    with pytest.raises(ValueError):
        bootstrap.start_script("http://c", "t", sha, [])
    with pytest.raises(ValueError):
        bootstrap.start_script("http://c", "t", sha, ["a\0b"])
    with pytest.raises(ValueError):
        bootstrap.start_script("http://c", "t", sha, ["x"], env={"A B": "1"})
    script = bootstrap.start_script("http://c", "t", sha, ["x"], ca_pem="-----BEGIN CERTIFICATE-----\n'x'\n")
    assert subprocess.run(["sh", "-n"], input=script, text=True).returncode == 0


def test_coordinator_process_serves_the_agent_from_the_flag(tmp_path, agent_file):
    """``anex-agent coordinator --agent-binary PATH``: a real process, the script against it, a
    second architecture given as ARCH=PATH, and the join with the provision token."""
    other = tmp_path / "other-agent"
    other.write_bytes(b"\x7fELF-not-really")
    proc = CoordinatorProcess(["--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "state"),
                               "--agent-binary", str(agent_file), "--agent-binary", f"riscv64={other}"],
                              env={**os.environ, "ANEX_ADMIN_TOKEN": "anexadm_test-admin-token-1234567890"})
    try:
        url = proc.wait_listening()

        async def scenario():
            from anex_agent.client.rest import CoordinatorClient

            admin = CoordinatorClient(url, admin_token="anexadm_test-admin-token-1234567890")
            try:
                token = (await admin.create_join_token(labels={})).token
            finally:
                await admin.close()
            status, headers, body = await _get(f"{url}/v1/agent/riscv64", token)
            assert status == 200 and body == other.read_bytes()
            sha = hashlib.sha256(agent_file.read_bytes()).hexdigest()
            script = bootstrap.start_script(url, token, sha, ["a b", "c'd"], state_dir=str(tmp_path / "boot"))
            return await _run_script(script, _toolbox(tmp_path, "curl"), tmp_path)

        code, out = asyncio.run(scenario())
        assert code == 0 and "FAKE-AGENT-RAN" in out, out
    finally:
        stderr = proc.stop()
    assert "anexjt_" not in stderr


def test_agent_binary_flag_values(tmp_path, agent_file):
    from anex_agent.coordinator.cli import agent_binaries
    from anex_agent.errors import ConfigError

    both = agent_binaries([str(agent_file), f"riscv64={agent_file}"])
    assert dict(both) == {ARCH: agent_file.resolve(), "riscv64": agent_file.resolve()}
    for bad in ([str(tmp_path / "missing")], [str(agent_file), str(agent_file)], [f"x/y={agent_file}"], ["=x"]):
        with pytest.raises(ConfigError) as info:
            agent_binaries(bad)
        assert info.value.source == "--agent-binary"


async def test_start_script_picks_the_hash_of_its_architecture(coord, agent_file, tmp_path):
    creds = await _issue(coord)
    hashes = await agent_download.agent_sha256s(coord.ctx.settings)
    assert list(hashes) == [ARCH]
    box = _toolbox(tmp_path, "curl")
    script = bootstrap.start_script(coord.url, creds.secret, {**hashes, "riscv64": "1" * 64}, ["x"],
                                    state_dir=str(tmp_path / "s1"))
    code, out = await _run_script(script, box, tmp_path)
    assert code == 0 and "FAKE-AGENT-RAN" in out, out
    script = bootstrap.start_script(coord.url, creds.secret, {"riscv64": hashes[ARCH]}, ["x"],
                                    state_dir=str(tmp_path / "s2"))
    code, out = await _run_script(script, box, tmp_path)
    assert code == 1 and f"no agent for architecture {ARCH}" in out, out
    assert not (tmp_path / "s2" / "anex-agent").exists()
    with pytest.raises(ValueError):
        bootstrap.start_script(coord.url, creds.secret, {"x86 64": "1" * 64}, ["x"])
