"""The coordinator's certificates with the agent's SSH server and the ``anex-agent ssh`` client code."""

from __future__ import annotations

import asyncio
import dataclasses
import os

import asyncssh
import pytest

from anex_agent import ssh_client, ssh_client_cp
from anex_agent.agent.ssh_access import SessionContext, SshAccess


@pytest.fixture
async def node_server(coord, tmp_path):
    client, joined, _ = await coord.join("web-1")
    access = SshAccess(tmp_path, 0, lambda: SessionContext(env={"PATH": os.environ["PATH"]}, cwd=str(tmp_path)))
    await access.refresh(client, joined.node_id, joined.config.address)
    server = await asyncio.get_running_loop().create_server(access.protocol_factory(), "127.0.0.1", 0)
    yield joined, access, server.sockets[0].getsockname()[1]
    server.close()


async def test_certificate_for_a_fresh_key_logs_in_and_the_host_certificate_is_verified(coord, node_server):
    joined, access, port = node_server
    target = await ssh_client.certify(coord.admin, "web-1")  # by its (unique) name
    assert target.node_id == joined.node_id and target.address == joined.config.address and target.port == 2222
    known = asyncssh.import_known_hosts("".join(line + "\n" for line in target.known_hosts))
    async with asyncssh.connect("127.0.0.1", port, username=target.node_id, known_hosts=known, agent_path=None,
                                client_keys=[(target.key, target.certificate)],
                                host_key_alias=target.address) as conn:  # the node's mesh address, certified
        assert (await conn.run("echo hi")).stdout == "hi\n"
    with pytest.raises(asyncssh.HostKeyNotVerifiable):  # a name the host certificate does not carry
        await ssh_client.connect(dataclasses.replace(target, address="127.0.0.1", port=port))
    audit = await coord.admin.list_ssh_certificates(joined.node_id)
    assert [r.kind for r in audit.certificates] == ["user", "host"]
    await access.flush_reports(coord.clients[1])  # the node's client: sessions reach the coordinator
    sessions = await coord.admin.list_ssh_sessions(joined.node_id)
    assert [(s.session.kind, s.session.command, s.session.exit_status) for s in sessions.sessions] == \
        [("exec", "echo hi", 0)]


async def test_names_and_remote_paths(coord):
    _, a, _ = await coord.join("twin")
    _, b, _ = await coord.join("twin")
    with pytest.raises(Exception) as err:
        await ssh_client.resolve_node(coord.admin, "twin")
    assert a.node_id in str(err.value) and b.node_id in str(err.value)
    assert await ssh_client.resolve_node(coord.admin, a.node_id) == a.node_id
    assert ssh_client_cp.split_remote("web-1:/tmp/x") == ("web-1", "/tmp/x")
    assert ssh_client_cp.split_remote("./local:file") is None
    assert ssh_client_cp.split_remote("plain") is None
    assert ssh_client.exit_code(None, ("TERM", False, "", "")) == 143
    assert ssh_client.exit_code(3, None) == 3
