"""``anex-agent ssh`` / ``cp`` as a user meets them: quiet by default, stdin from ``/dev/null``,
an offline node said to be offline, paths in errors shown as text.

The node is the agent's SSH server on 127.0.0.1 (``node_server``); the client's ``connect`` is
pointed there, with the node's mesh address as the host-key alias, as in
``test_ssh_end_to_end``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

import asyncssh
import pytest

from anex_agent import cli
from anex_agent.remote import ssh_client, cp_client as ssh_client_cp
from anex_agent.wire.heartbeat import Heartbeat
from tests.coordinator.test_ssh_end_to_end import node_server  # noqa: F401 (a fixture)


@pytest.fixture
def to_node(coord, node_server, monkeypatch):  # noqa: F811
    """The ssh and cp clients reach the test's node server and use the harness's admin client."""
    joined, _, port = node_server

    async def connect(target):
        known = asyncssh.import_known_hosts("".join(line + "\n" for line in target.known_hosts))
        return await asyncssh.connect("127.0.0.1", port, username=target.node_id, known_hosts=known,
                                      client_keys=[(target.key, target.certificate)], agent_path=None,
                                      host_key_alias=target.address, config=None)

    for module in (ssh_client, ssh_client_cp):
        monkeypatch.setattr(module, "connect", connect)
        monkeypatch.setattr(module, "coordinator_client", lambda args: coord.admin)
    coord.admin.close = _no_close  # shared with the harness: closed by it
    return joined


async def _no_close() -> None:
    return None


def ssh_args(*command: str, node: str = "web-1") -> argparse.Namespace:
    return argparse.Namespace(command=["--", *command], no_tty=False, tty=False, node=node, validity=None, forwards=[])


def test_asyncssh_logs_only_with_verbose(monkeypatch):
    monkeypatch.setenv("ANEX_ADMIN_TOKEN", "a" * 32)
    asyncssh_log = logging.getLogger("asyncssh")
    monkeypatch.setattr(asyncssh_log, "level", asyncssh_log.level)  # restored afterwards
    for argv in (["ssh", "--coordinator", "http://127.0.0.1:1", "web-1", "--", "true"],
                 ["cp", "--coordinator", "http://127.0.0.1:1", "web-1:/x", "/tmp/x"]):
        assert cli.main(argv) == 255  # the coordinator is unreachable: what matters is the level set
        assert not asyncssh_log.isEnabledFor(logging.INFO)  # no "Opening SSH connection ..." lines
        assert cli.main(["-v", *argv]) == 255
        assert asyncssh_log.isEnabledFor(logging.INFO)


async def test_a_command_with_stdin_from_dev_null(to_node, monkeypatch, capfd):
    with open("/dev/null") as devnull:
        monkeypatch.setattr(sys, "stdin", devnull)
        async with asyncio.timeout(60):  # the old client never saw EOF here: fail instead of hanging
            assert await ssh_client.run(ssh_args("sh", "-c", "cat; echo done")) == 0
    out = capfd.readouterr()
    assert out.out == "done\n" and "Traceback" not in out.err and "Operation not permitted" not in out.err


async def test_an_offline_node_is_said_to_be_offline(coord, node_server, to_node, monkeypatch, capsys):  # noqa: F811
    async def unreachable(target):
        raise TimeoutError  # what asyncio.wait_for raises when the connection does not come up

    monkeypatch.setattr(ssh_client, "connect", unreachable)
    assert await ssh_client.run(ssh_args("true")) == 255
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"anex-agent ssh: node {to_node.node_id} (web-1) at {to_node.config.address}:2222: "
                          "no answer within 15 s; the node is offline: the coordinator has it pending "
                          "(no heartbeat since it joined)")
    node_client = coord.clients[1]
    await node_client.heartbeat(to_node.node_id, Heartbeat())
    coord.clock.advance(coord.ctx.settings.timings.not_ready_after + 1)
    assert await ssh_client.run(ssh_args("true")) == 255
    err = capsys.readouterr().err
    assert "the node is offline: the coordinator has it not ready (last heartbeat 20" in err
    assert err.count("\n") == 1


async def test_a_ready_node_that_does_not_answer_says_what_to_check(to_node, coord, monkeypatch, capsys):
    async def unreachable(target):
        raise TimeoutError

    await coord.clients[1].heartbeat(to_node.node_id, Heartbeat())
    monkeypatch.setattr(ssh_client, "connect", unreachable)
    assert await ssh_client.run(ssh_args("true")) == 255
    err = capsys.readouterr().err
    assert "no answer within 15 s; this machine needs a route to the mesh" in err and "offline" not in err


async def test_cp_names_paths_as_text(to_node, tmp_path, capsys):
    missing = tmp_path / "missing"
    args = argparse.Namespace(source=str(missing), destination="web-1:/tmp/x", recursive=False, validity=None)
    assert await ssh_client_cp.run(args) == 1
    assert capsys.readouterr().err == f"anex-agent cp: {missing}: No such file or directory\n"  # not b'...'
    args = argparse.Namespace(source="web-1:/nonexistent/x", destination=str(tmp_path / "y"), recursive=False,
                              validity=None)
    assert await ssh_client_cp.run(args) == 1
    assert capsys.readouterr().err == "anex-agent cp: web-1:/nonexistent/x: No such file\n"
