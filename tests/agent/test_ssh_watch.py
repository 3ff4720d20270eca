"""The watch stream's SSH events reach the agent's SSH server state."""

from __future__ import annotations

import time
from types import SimpleNamespace

from anex_agent.wire import ssh as ssh_wire
from anex_agent.wire.watch import SshRevocation, WatchEvent
from anex_agent.agent.heartbeat import ssh_event
from anex_agent.remote.ssh_access import SessionContext, SshAccess


class FakeClient:
    def __init__(self, revoked):
        self.revoked = revoked
        self.calls = 0

    async def ssh_revocations(self, node_id):
        self.calls += 1
        return ssh_wire.SshRevocations(user_ca_keys=["ssh-ed25519 AAAAnew"], revoked_serials=self.revoked)


async def test_revocation_event_and_snapshot_refresh(tmp_path):
    access = SshAccess(tmp_path, 2222, lambda: SessionContext(env={}))
    access.node_id, access.user_ca_keys = "n-1", ("ssh-ed25519 AAAAold",)
    client = FakeClient([4, 9])
    agent = SimpleNamespace(ssh=access, link=SimpleNamespace(client=client))
    await ssh_event(agent, WatchEvent(type="ssh_revoked", version=7,
                                           ssh_revoked=SshRevocation(serial=3, valid_before=time.time() + 60)))
    assert access.is_revoked(3) and not access.is_revoked(4) and client.calls == 0
    before = access.options_version
    config_event = WatchEvent(type="config", version=8)
    await ssh_event(agent, config_event)
    assert client.calls == 0
    await ssh_event(agent, WatchEvent(type="snapshot", version=9))
    assert client.calls == 1  # a snapshot: revocations may have been missed, the full list replaces ours
    assert access.is_revoked(4) and access.is_revoked(9) and not access.is_revoked(3)
    assert access.user_ca_keys == ("ssh-ed25519 AAAAnew",) and access.options_version == before + 1
    assert access.status() == {"port": 2222, "host_certificate": False, "host_certificate_valid_until": None,
                               "revoked_serials": 2, "connections": 0}


def test_host_key_is_made_once_with_mode_0600(tmp_path):
    first = SshAccess(tmp_path, 2222, lambda: None)
    assert (tmp_path / "ssh-host-key").stat().st_mode & 0o777 == 0o600
    assert first.host_public.startswith("ssh-ed25519 ")
    assert SshAccess(tmp_path, 2222, lambda: None).host_public == first.host_public
