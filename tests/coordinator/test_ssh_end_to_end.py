"""The coordinator's certificates with the agent's SSH server and the ``anex-agent ssh`` client code."""

from __future__ import annotations

import asyncio
import dataclasses
import os

import asyncssh
import pytest

from anex_agent.remote import ssh_client, cp_client as ssh_client_cp
from anex_agent.remote.ssh_access import SessionContext, SshAccess


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
    listed = []
    list_nodes = coord.admin.list_nodes

    async def counted():
        listed.append(1)
        return await list_nodes()

    coord.admin.list_nodes = counted
    assert await ssh_client.resolve_node(coord.admin, a.node_id) == a.node_id
    assert listed == []  # an id is looked up alone, never by listing the fleet
    _, c, _ = await coord.join("solo")
    assert await ssh_client.resolve_node(coord.admin, "solo") == c.node_id and listed == [1]
    with pytest.raises(Exception, match="no node 'n-000000000000'"):
        await ssh_client.resolve_node(coord.admin, "n-000000000000")  # id-shaped, unknown: not a name either
    assert ssh_client_cp.split_remote("web-1:/tmp/x") == ("web-1", "/tmp/x")
    assert ssh_client_cp.split_remote("./local:file") is None
    assert ssh_client_cp.split_remote("plain") is None
    assert ssh_client.exit_code(None, ("TERM", False, "", "")) == 143
    assert ssh_client.exit_code(3, None) == 3


async def test_the_ssh_issuer_token_gets_certificates_and_nothing_else(tmp_path, clock):
    from aiohttp.test_utils import TestServer

    from anex_agent.wire import ssh as ssh_wire
    from anex_agent.client.rest import CoordinatorClient
    from anex_agent.coordinator.app import build_app
    from anex_agent.coordinator.context import Coordinator
    from anex_agent.coordinator.settings import Settings
    from anex_agent.errors import CoordinatorError
    from tests.coordinator.conftest import Harness

    token_file = tmp_path / "issuer"
    token_file.write_text("issuer-" + "x" * 32 + "\n")
    os.chmod(token_file, 0o600)
    settings = Settings.for_tests(tmp_path, poll_interval=0.2, sweep_interval=3600, ssh_issuer_token_file=token_file)
    ctx = await Coordinator.open(settings, clock=clock, environ={})
    server = TestServer(build_app(ctx))
    await server.start_server()
    harness = Harness(ctx, server, None, clock, [])
    harness.admin = harness.client(admin_token=ctx.admin_token)
    issuer = harness.client(admin_token="issuer-" + "x" * 32)
    issuer.lists_nodes = False  # as ssh_client.coordinator_client marks a client with the issuer token
    try:
        client, joined, _ = await harness.join("n1")
        await client.ssh_host_certificate(joined.node_id, asyncssh.generate_private_key("ssh-ed25519")
                                          .export_public_key().decode())
        target = await ssh_client.certify(issuer, joined.node_id)  # no node list: the id is taken as is
        assert target.node_id == joined.node_id
        audit = await harness.admin.list_ssh_certificates(joined.node_id)
        assert audit.certificates[0].issued_by == "ssh-issuer"
        for call in (issuer.list_nodes(), issuer.list_ssh_certificates(), issuer.revoke_ssh_certificate(target.serial)):
            with pytest.raises(CoordinatorError) as err:
                await call
            assert err.value.status == 401
    finally:
        for c in harness.clients:
            await c.close()
        await server.close()
    os.chmod(token_file, 0o644)
    with pytest.raises(Exception) as err:
        await Coordinator.open(settings, clock=clock, environ={})
    assert "--ssh-issuer-token-file" in str(err.value)


def test_the_client_takes_the_admin_token_else_the_issuer_token(tmp_path):
    import argparse

    args = argparse.Namespace(coordinator="http://c:1", admin_token_file=None, ca_file=None)
    admin = ssh_client.coordinator_client(args, {"ANEX_ADMIN_TOKEN": "a" * 20, "ANEX_SSH_ISSUER_TOKEN": "i" * 20})
    issuer = ssh_client.coordinator_client(args, {"ANEX_SSH_ISSUER_TOKEN": "i" * 20})
    assert (admin.admin_token, admin.lists_nodes) == ("a" * 20, True)
    assert (issuer.admin_token, issuer.lists_nodes) == ("i" * 20, False)
    with pytest.raises(Exception) as err:
        ssh_client.coordinator_client(args, {})
    assert "ANEX_ADMIN_TOKEN" in str(err.value)
