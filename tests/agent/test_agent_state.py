"""State dir: 0600 files, identity and last good config survive a restart."""

import logging
import os
import stat

import pytest

from anex_agent.agent.state import NodeIdentity, StateDir
from anex_agent.errors import ConfigError
from anex_agent.wire.nodes import GatewayPeer, NodeConfig

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


def test_open_state_dir_and_files_are_made_private_with_a_warning(tmp_path, caplog):
    state = StateDir(tmp_path / "state")
    state.ensure()
    state.save_config(config())
    (state.path / "node.json").write_text("{}")
    os.chmod(state.path / "node.json", 0o644)
    os.chmod(state.path, 0o755)
    assert mode(state.path / "last-config.json") == 0o600
    with caplog.at_level(logging.WARNING):
        state.ensure()
    assert stat.S_IMODE(os.stat(state.path).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(state.path / "node.json").st_mode) == 0o600
    text = caplog.text
    assert f"state dir {state.path} was mode 0755" in text and "node.json was mode 0644" in text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        state.ensure()
    assert caplog.text == ""  # nothing to fix: nothing said


def test_state_dir_of_another_user_is_refused(tmp_path):
    state = StateDir(tmp_path / "state")
    state.ensure()
    with pytest.raises(ConfigError) as info:
        state.secure(euid=os.geteuid() + 1)
    assert info.value.source == "ANEX_STATE_DIR" and "belongs to uid" in str(info.value)
