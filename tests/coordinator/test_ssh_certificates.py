"""Remote access on the coordinator: the SSH CA, user and host certificates, audit, revocation via watch."""

from __future__ import annotations

import asyncio
import os
import stat

import asyncssh
import pytest

from anex_agent.wire import ssh as ssh_wire
from anex_agent.coordinator import changes, ssh_ca, ssh_certs
from anex_agent.coordinator.auth import Principal
from anex_agent.coordinator.db import open_database
from anex_agent.coordinator.migrations import CORE, apply
from anex_agent.coordinator.context import Coordinator
from anex_agent.coordinator.settings import Settings
from anex_agent.errors import ConfigError, CoordinatorError

from tests.coordinator.lock_waits import PausedBefore, another_waits
from tests.coordinator.test_watch import next_event
from tests.polling import wait_until


def user_key() -> tuple[asyncssh.SSHKey, str]:
    key = asyncssh.generate_private_key("ssh-ed25519")
    return key, key.export_public_key().decode()


async def ssh_node(coord, name: str = "n1"):
    """A node that runs an SSH server: its host key is certified."""
    client, joined, pair = await coord.join(name)
    _, host = user_key()
    await client.ssh_host_certificate(joined.node_id, host)
    return client, joined, pair


async def test_user_certificate_is_bound_to_the_node_short_lived_and_audited(coord):
    _, joined, _ = await ssh_node(coord)
    key, public = user_key()
    cert = await coord.admin.create_ssh_certificate(
        joined.node_id, ssh_wire.SshCertificateRequest(public_key=public, features=["pty"], requested_for="alice"))
    parsed = asyncssh.import_certificate(cert.certificate)
    assert parsed.principals == [joined.node_id] and cert.principals == [joined.node_id]
    assert parsed._serial == cert.serial == ssh_wire.serial_of(parsed._key_id)
    assert 590 <= parsed._valid_before - coord.clock.now <= 600  # default 10 minutes
    assert parsed.signing_key.export_public_key().decode().split()[:2] == coord.ctx.ssh_ca.public.split()
    assert "permit-pty" in parsed.options and "permit-port-forwarding" not in parsed.options
    assert "permit-agent-forwarding" not in parsed.options and "permit-X11-forwarding" not in parsed.options
    assert ssh_wire.features_of(parsed._key_id) == {"pty"}
    parsed.validate(asyncssh.public_key.CERT_TYPE_USER, joined.node_id)
    with pytest.raises(ValueError):
        parsed.validate(asyncssh.public_key.CERT_TYPE_USER, "another-node")
    assert cert.address == joined.config.address
    assert cert.known_hosts == [f"@cert-authority * {coord.ctx.ssh_ca.public}"]
    audit = await coord.admin.list_ssh_certificates(joined.node_id)
    record, host_record = audit.certificates
    assert host_record.kind == "host"
    assert (record.serial, record.kind, record.issued_by, record.requested_for) == (cert.serial, "user", "admin", "alice")
    assert record.fingerprint == ssh_ca.fingerprint(key)
    assert record.revoked_at is None


async def test_validity_is_capped_and_keys_are_checked(coord):
    _, joined, _ = await ssh_node(coord)
    _, public = user_key()
    with pytest.raises(CoordinatorError) as err:
        await coord.admin.create_ssh_certificate(joined.node_id, ssh_wire.SshCertificateRequest(public_key=public,
                                                                                                 validity=7200))
    assert err.value.status == 422 and err.value.problem["errors"][0]["field"] == "validity"
    with pytest.raises(CoordinatorError) as err:
        await coord.admin.create_ssh_certificate(joined.node_id, ssh_wire.SshCertificateRequest(public_key="ssh-ed25519 AAAA"))
    assert err.value.status == 422 and err.value.problem["errors"][0]["field"] == "public_key"
    with pytest.raises(asyncssh.KeyImportError) as library:
        asyncssh.import_public_key("ssh-ed25519 AAAA")
    # the caller reads the coordinator's text, never the SSH library's
    assert err.value.problem["errors"][0]["message"] == "not an OpenSSH public key (one line: TYPE BASE64 [COMMENT])"
    assert str(library.value) not in err.value.problem["detail"]
    with pytest.raises(CoordinatorError) as err:
        await coord.admin.create_ssh_certificate("n_nope", ssh_wire.SshCertificateRequest(public_key=public))
    assert err.value.status == 404
    node_client, plain, _ = await coord.join("n2")
    with pytest.raises(CoordinatorError) as err:  # a node without an SSH server (its host key never certified)
        await coord.admin.create_ssh_certificate(plain.node_id, ssh_wire.SshCertificateRequest(public_key=public))
    assert err.value.status == 409 and "no SSH server" in err.value.problem["detail"]
    with pytest.raises(CoordinatorError) as err:  # a node cannot get user certificates
        await node_client._call("POST", f"/v1/nodes/{joined.node_id}/ssh-certificates", ssh_wire.SshCertificate,
                                auth="credential", body=ssh_wire.SshCertificateRequest(public_key=public))
    assert err.value.status == 401


async def test_host_certificate_names_the_node_id_and_address_not_its_chosen_name(coord):
    client, joined, _ = await coord.join("shared-name")
    other, other_joined, _ = await coord.join("shared-name")
    host = asyncssh.generate_private_key("ssh-ed25519")
    answer = await client.ssh_host_certificate(joined.node_id, host.export_public_key().decode())
    parsed = asyncssh.import_certificate(answer.certificate)
    assert parsed.principals == [joined.node_id, joined.config.address] == answer.principals
    parsed.validate(asyncssh.public_key.CERT_TYPE_HOST, joined.config.address)
    assert answer.user_ca_keys == [coord.ctx.ssh_ca.public] and answer.revoked_serials == []
    with pytest.raises(CoordinatorError) as err:  # a node certifies only its own host key
        await other.ssh_host_certificate(joined.node_id, host.export_public_key().decode())
    assert err.value.status == 403
    kinds = [r.kind for r in (await coord.admin.list_ssh_certificates(joined.node_id)).certificates]
    assert kinds == ["host"]


async def test_revocation_reaches_the_node_watch_and_the_list(coord):
    client, joined, _ = await ssh_node(coord)
    _, public = user_key()
    first = await coord.admin.create_ssh_certificate(joined.node_id, ssh_wire.SshCertificateRequest(public_key=public))
    second = await coord.admin.create_ssh_certificate(joined.node_id, ssh_wire.SshCertificateRequest(public_key=public))
    stream = client.watch(joined.config.version)
    await asyncio.sleep(0.3)  # connected
    record = await coord.admin.revoke_ssh_certificate(first.serial)
    assert record.revoked_at is not None and record.revoked_by == "admin"
    event = await next_event(stream)
    assert event.type == "ssh_revoked" and event.ssh_revoked.serial == first.serial
    await stream.aclose()
    assert (await client.ssh_revocations(joined.node_id)).revoked_serials == [first.serial]
    # a node that missed it gets it replayed when it resumes (also from its config version)
    await coord.admin.revoke_ssh_certificate(second.serial)
    for since in (event.version, joined.config.version):
        stream = client.watch(since)
        replayed = [await next_event(stream, timeout=5)]
        if since < event.version:
            replayed.append(await next_event(stream, timeout=5))
        assert [e.type for e in replayed] == ["ssh_revoked"] * len(replayed)
        assert replayed[-1].ssh_revoked.serial == second.serial
        await stream.aclose()
    # once expired it is no longer listed
    coord.clock.advance(601)
    assert (await client.ssh_revocations(joined.node_id)).revoked_serials == []
    with pytest.raises(CoordinatorError) as err:
        await coord.admin.revoke_ssh_certificate(10_000)
    assert err.value.status == 404


async def test_two_concurrent_revocations_keep_the_first_and_tell_the_node_once(coord):
    """Another coordinator's revocation of the same certificate commits after ours read it as
    unrevoked: ours changes nothing (revoking twice is a no-op), so the audit keeps who revoked
    it first and when, and the node's stream carries one ``ssh_revoked``. (PostgreSQL runs READ
    COMMITTED: an unconditional update overwrote the first revocation and told the node twice.)"""
    _, joined, _ = await ssh_node(coord)
    _, public = user_key()
    cert = await coord.admin.create_ssh_certificate(joined.node_id, ssh_wire.SshCertificateRequest(public_key=public))
    db, first_at = coord.ctx.db, float(int(coord.clock()) - 5)  # whole seconds: exact as a datetime

    async def told() -> list:
        return await db.fetch("SELECT version FROM changes WHERE type = $1 AND target = $2",
                              changes.ChangeType.SSH_REVOKED.value, joined.node_id)

    async with db.transaction() as other:  # the other coordinator's revocation, not yet committed
        await other.execute("UPDATE ssh_certificates SET revoked_at = $2, revoked_by = 'ssh-issuer' WHERE serial = $1",
                            cert.serial, first_at)
        await changes.append(db, other, changes.Scope.ONE_NODE, changes.ChangeType.SSH_REVOKED, target=joined.node_id,
                             payload={"serial": cert.serial, "valid_before": cert.valid_before.timestamp()},
                             now=first_at)
        ours = asyncio.create_task(ssh_certs.revoke(coord.ctx, cert.serial, Principal("admin")))
        await wait_until(lambda: another_waits(db), what="our revocation to wait for the other one")
    record = await ours
    assert (record.revoked_at.timestamp(), record.revoked_by) == (first_at, "ssh-issuer")
    assert len(await told()) == 1


async def test_sessions_reported_by_a_node_are_listed(coord):
    client, joined, _ = await coord.join("n1")
    from datetime import datetime, timezone
    now = datetime.now(timezone.utc)
    session = ssh_wire.SshSession(id="s1", serial=3, kind="exec", command="true", started_at=now)
    await client.report_ssh_sessions(joined.node_id, [session])
    await client.report_ssh_sessions(joined.node_id, [session.model_copy(update={"ended_at": now, "exit_status": 0})])
    listed = await coord.admin.list_ssh_sessions(joined.node_id)
    [record] = listed.sessions
    assert record.node_id == joined.node_id and record.session.exit_status == 0


async def test_ca_key_is_private_registered_and_rotatable(tmp_path, clock):
    settings = Settings.for_tests(tmp_path)
    ctx = await Coordinator.open(settings, clock=clock, environ={})
    old_public = ctx.ssh_ca.public
    await ctx.close()
    path = tmp_path / ssh_ca.FILE_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    other = tmp_path / "other-ca"
    ssh_ca.load_or_create(other)
    with pytest.raises(ConfigError) as err:  # a coordinator with another CA refuses to start
        await Coordinator.open(Settings.for_tests(tmp_path, ssh_ca_key_file=other), clock=clock, environ={})
    assert str(other) in str(err.value)
    rotated = await Coordinator.open(Settings.for_tests(tmp_path, ssh_ca_key_file=other, ssh_ca_previous=(old_public,)),
                                     clock=clock, environ={})
    assert rotated.ssh_ca.trusted == [ssh_ca.openssh_public(ssh_ca.load_or_create(other)), old_public]
    assert len(rotated.ssh_ca.known_hosts()) == 2
    await rotated.close()
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError):
        ssh_ca.load_or_create(path)


async def test_two_coordinators_rotating_to_different_keys_at_once_leave_one_running(tmp_path, database_url):
    """Both start with a new CA key naming the registered one as previous: one rotates, the other
    refuses to start (naming its key file), whatever their timing. (PostgreSQL runs READ
    COMMITTED: with a plain read of the registered key, both read the old one, both replaced it,
    and both started, signing with two different CAs of which the database knew one.)"""
    old, a, b = (ssh_ca.load_or_create(tmp_path / name) for name in ("old", "a", "b"))
    db = await open_database(database_url)
    try:
        await apply(db, CORE)
        previous = (ssh_ca.openssh_public(old),)
        await ssh_ca.register(db, old, key_path=tmp_path / "old")
        first_db = PausedBefore(db, "UPDATE settings")

        async def start(database, private, name):
            try:
                return await ssh_ca.register(database, private, key_path=tmp_path / name, previous=previous)
            except ConfigError as err:
                return err

        first = asyncio.create_task(start(first_db, a, "a"))
        await wait_until(first_db.paused.is_set, what="the first coordinator to read the registered key")
        second = asyncio.create_task(start(db, b, "b"))
        await wait_until(lambda: second.done() or another_waits(db), what="the second coordinator to start or wait")
        first_db.go.set()
        results = [await first, await second]
        started = [r for r in results if isinstance(r, str)]
        refused = [r for r in results if isinstance(r, ConfigError)]
        assert len(started) == 1 and len(refused) == 1, results
        assert await db.fetchval("SELECT value FROM settings WHERE name = $1", ssh_ca.SETTING) == started[0]
    finally:
        await db.close()
