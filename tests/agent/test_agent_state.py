"""State dir: 0600 files, identity and last good config survive a restart."""

import stat

import pytest

from anex_agent.agent.state import NodeIdentity, StateDir
from anex_agent.errors import ConfigError
from anex_agent.wire import GatewayPeer, NodeConfig

PUB = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="


def config(version=1):
    return NodeConfig(
        node_id="n1", version=version, address="10.254.0.5", network="10.254.0.0/16", mtu=1420, dns=["10.254.0.1"],
        gateways=[GatewayPeer(id="g", public_key=PUB, endpoint="192.0.2.1:51820", allowed_ips=["10.254.0.0/16"], mesh_address="10.254.0.1")],
    )


def mode(path):
    return stat.S_IMODE(path.stat().st_mode)


def test_key_is_created_once_0600(tmp_path):
    state = StateDir(tmp_path / "st")
    first = state.keypair()
    assert mode(tmp_path / "st") == 0o700
    assert mode(tmp_path / "st" / "private.key") == 0o600
    assert StateDir(tmp_path / "st").keypair().public_b64 == first.public_b64


def test_identity_roundtrip_and_coordinator_mismatch(tmp_path):
    state = StateDir(tmp_path)
    assert state.load_identity("http://c") is None
    ident = NodeIdentity("http://c", "n1", "secret-cred")
    state.save_identity(ident)
    assert mode(tmp_path / "node.json") == 0o600
    assert state.load_identity("http://c") == ident
    assert state.load_identity("http://other") is None
    assert "secret-cred" not in repr(ident)


def test_corrupt_identity_is_a_config_error(tmp_path):
    (tmp_path / "node.json").write_text("{")
    with pytest.raises(ConfigError) as info:
        StateDir(tmp_path).load_identity("http://c")
    assert "node.json" in str(info.value)


def test_config_roundtrip_and_overwrite(tmp_path):
    state = StateDir(tmp_path)
    assert state.load_config() is None
    state.save_config(config(1))
    state.save_config(config(2))
    assert state.load_config() == config(2)
    assert mode(tmp_path / "last-config.json") == 0o600
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_unreadable_config_is_none(tmp_path):
    (tmp_path / "last-config.json").write_text("garbage")
    assert StateDir(tmp_path).load_config() is None


def test_forget(tmp_path):
    state = StateDir(tmp_path)
    state.save_identity(NodeIdentity("http://c", "n1", "x"))
    state.save_config(config())
    state.forget_identity()
    assert state.load_identity("http://c") is None and state.load_config() is None
