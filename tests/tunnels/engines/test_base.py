"""The engine contract's defaults: handshake_now re-adds only the peers named."""

from __future__ import annotations

import pytest

from anex_agent.tunnels.engines import base
from anex_agent.tunnels.engines.config import DesiredConfig, PeerConfig
from anex_agent.tunnels.engines.status import Support

KA, KB, KC = ("A" * 43 + "=", "B" * 43 + "=", "C" * 43 + "=")


def peer(key, ips=("10.254.0.2/32",), endpoint=None, keepalive=0, psk=None):
    return PeerConfig(public_key=key, endpoint=endpoint, allowed_ips=tuple(ips), persistent_keepalive=keepalive,
                      preshared_key=psk)


class _Recording(base.Engine):
    """Only what handshake_now's default uses: records apply() and update_peers()."""

    name = "recording"

    def __init__(self, *, per_peer: bool) -> None:
        self.per_peer = per_peer
        self.calls: list[tuple] = []

    @classmethod
    def is_supported(cls) -> Support:
        return Support(True, "test")

    async def start(self, tasks) -> None: ...

    async def apply(self, desired, workload=None) -> bool:
        self.calls.append(("apply", tuple(p.public_key for p in desired.peers)))
        return True

    async def update_peers(self, upsert, remove) -> bool:
        if not self.per_peer:
            return False
        self.calls.append(("update", tuple(p.public_key for p in upsert), tuple(remove)))
        return True

    async def status(self): ...

    async def stop(self) -> None: ...

    def dialer(self, resolver): ...


@pytest.mark.parametrize("per_peer", [True, False], ids=["update_peers", "apply"])
async def test_handshake_now_re_adds_only_the_peers_named(per_peer):
    """A re-added peer has no last initiation: with persistent keepalive the engine initiates at once."""
    engine = _Recording(per_peer=per_peer)
    desired = DesiredConfig(private_key=bytes(32), listen_port=None, address="10.254.0.5/16", mtu=1420,
                            peers=(peer(KA, keepalive=25), peer(KB, ips=("10.254.0.3/32",), keepalive=25)))
    assert await engine.handshake_now(desired, {KB})
    if per_peer:
        assert engine.calls == [("update", (), (KB,)), ("update", (KB,), ())]
    else:
        assert engine.calls == [("apply", (KA,)), ("apply", (KA, KB))]
    assert not await engine.handshake_now(desired, {KC})  # not a peer: nothing asked
