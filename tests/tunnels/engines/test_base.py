"""The engine contract: config validation, the pure peer diff, engine choice."""

from __future__ import annotations

import pytest

from anex_agent.errors import ConfigError, EngineError
from anex_agent.tunnels.engines import base
from anex_agent.tunnels.engines.base import DesiredConfig, PeerConfig, Support, plan_peers

KA, KB, KC = ("A" * 43 + "=", "B" * 43 + "=", "C" * 43 + "=")


def peer(key, ips=("10.254.0.2/32",), endpoint=None, keepalive=0, psk=None):
    return PeerConfig(public_key=key, endpoint=endpoint, allowed_ips=tuple(ips), persistent_keepalive=keepalive,
                      preshared_key=psk)


def test_same_peers_plan_nothing():
    peers = (peer(KA), peer(KB, endpoint="192.0.2.1:51820", keepalive=25))
    assert plan_peers(peers, peers).empty


def test_allowed_ips_compared_as_normalised_sets():
    assert plan_peers((peer(KA, ("10.0.0.0/24", "10.1.0.0/16")),), (peer(KA, ("10.1.0.5/16", "10.0.0.0/24")),)).empty


def test_add_update_remove():
    current = (peer(KA), peer(KB), peer(KC, keepalive=25))
    desired = (peer(KA, ips=("10.254.0.9/32",)), peer(KC, keepalive=25), peer("D" * 43 + "="))
    plan = plan_peers(current, desired)
    assert [p.public_key for p in plan.add] == ["D" * 43 + "="]
    assert [p.public_key for p in plan.update] == [KA]
    assert plan.remove == (KB,)


def test_roamed_endpoint_is_kept_when_desired_has_none():
    # the hub learns node endpoints; a desired peer without endpoint must not reset it
    assert plan_peers((peer(KA, endpoint="198.51.100.7:40000"),), (peer(KA),)).empty
    assert plan_peers((peer(KA, endpoint="198.51.100.7:40000"),), (peer(KA, endpoint="192.0.2.1:1"),)).update


def test_keepalive_and_psk_changes_are_updates():
    assert plan_peers((peer(KA),), (peer(KA, keepalive=25),)).update
    assert plan_peers((peer(KA, psk=KB),), (peer(KA),)).update


def test_private_key_not_in_repr():
    cfg = DesiredConfig(private_key=bytes(range(32)), listen_port=None, address="10.254.0.5/16", mtu=1420)
    assert "private_key" not in repr(cfg) and str(bytes(range(32))) not in repr(cfg)
    assert "preshared_key" not in repr(peer(KA, psk=KB))


@pytest.mark.parametrize(
    "kwargs, source",
    [
        ({"private_key": b"x"}, "private_key"),
        ({"listen_port": 70000}, "listen_port"),
        ({"address": "10.254.0.5/40"}, "address"),
        ({"address": "not-an-ip"}, "address"),
        ({"mtu": 100}, "mtu"),
        ({"routes": ("10.96.0.0/99",)}, "routes"),
        ({"peers": (peer(KA), peer(KA))}, "peers"),
    ],
)
def test_desired_config_rejects(kwargs, source):
    args = {"private_key": bytes(32), "listen_port": None, "address": "10.254.0.5/16", "mtu": 1420, **kwargs}
    with pytest.raises(ConfigError) as info:
        DesiredConfig(**args)
    assert info.value.source == source


def test_peer_rejects_bad_allowed_ip_and_keepalive():
    with pytest.raises(ConfigError, match="allowed_ips"):
        peer(KA, ips=("10.0.0.0/33",))
    with pytest.raises(ConfigError, match="persistent_keepalive"):
        peer(KA, keepalive=70000)


def test_new_ifname_is_ours_and_short():
    names = {base.new_ifname("node") for _ in range(50)}
    assert len(names) == 50
    assert all(n.startswith("anxnod") and len(n) <= base.IFNAME_MAX for n in names)


@pytest.mark.parametrize("name", ["", "x" * 16, "a/b", "a b"])
def test_bad_ifnames(name):
    with pytest.raises(ConfigError, match="interface"):
        base.check_ifname(name)


def test_registry_lists_kernel_and_wireguard_go_in_auto_order():
    classes = base.engine_classes()
    assert list(classes)[:2] == ["kernel", "wireguard-go"]
    assert [n for n in base.AUTO_ORDER if n in classes] == list(classes)
    for name, cls in classes.items():
        assert cls.name == name


def _fake(name, ok):
    return type(f"Fake{name}", (), {"name": name, "is_supported": classmethod(lambda cls: Support(ok, f"{name} says {ok}"))})


def test_choose_engine_takes_first_supported(monkeypatch):
    monkeypatch.setattr(base, "engine_classes", lambda: {"kernel": _fake("kernel", False), "wireguard-go": _fake("wireguard-go", True)})
    cls, tried = base.choose_engine("auto")
    assert cls.name == "wireguard-go"
    assert tried["kernel"] == Support(False, "kernel says False")


def test_choose_engine_explains_failure(monkeypatch):
    monkeypatch.setattr(base, "engine_classes", lambda: {"kernel": _fake("kernel", False)})
    with pytest.raises(EngineError, match="kernel says False"):
        base.choose_engine("auto")
    with pytest.raises(ConfigError, match="not available in this build"):
        base.choose_engine("wireproxy", source="ANEX_ENGINE")
    with pytest.raises(ConfigError, match="engine"):
        base.choose_engine("magic")


def test_a_named_engine_that_cannot_run_here_names_the_setting_why_and_what_runs(monkeypatch):
    """ANEX_ENGINE=kernel without the module or CAP_NET_ADMIN: one line naming the variable (exit 2), not exit 1."""
    fakes = {"kernel": _fake("kernel", False), "wireguard-go": _fake("wireguard-go", True)}
    monkeypatch.setattr(base, "engine_classes", lambda: fakes)
    with pytest.raises(ConfigError) as err:
        base.choose_engine("kernel", source="ANEX_ENGINE")
    assert err.value.source == "ANEX_ENGINE"
    assert str(err.value) == ("ANEX_ENGINE: 'kernel': the kernel engine cannot run here (kernel says False); "
                              "engines that run here: wireguard-go, or auto (leave it unset) to pick one")
    fakes["wireguard-go"] = _fake("wireguard-go", False)
    with pytest.raises(ConfigError, match="engines that run here: none, or auto"):
        base.choose_engine("kernel", source="--engine")


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
