"""The gateway's state dir: key pair and saved registration (fail-static start)."""

from __future__ import annotations

from anex_agent.gateway.service import Gateway, GatewayState, Registration
from anex_agent.gateway.settings import build_settings
from anex_agent.wire import MeshPeer, PeerSet

REG = Registration(coordinator_url="http://127.0.0.1:8700", gateway_id="g1", credential="secret-credential",
                   address="10.254.0.1", network="10.254.0.0/16", mtu=1420)
PEERS = PeerSet(version=7, peers=[MeshPeer(node_id="n1", name="n1", public_key="A" * 43 + "=", allowed_ips=["10.254.0.2/32"])])


def test_saved_registration_roundtrip_is_private(tmp_path):
    state = GatewayState(tmp_path / "gw")
    state.ensure()
    state.save(REG, PEERS)
    path = tmp_path / "gw" / "gateway.json"
    assert path.stat().st_mode & 0o777 == 0o600
    loaded = state.load("http://127.0.0.1:8700")
    assert loaded == (REG, PEERS)
    assert "secret-credential" not in repr(REG)


def test_saved_state_of_another_coordinator_is_not_used(tmp_path):
    state = GatewayState(tmp_path)
    state.save(REG, PEERS)
    assert state.load("http://other:8700") is None


def test_corrupt_state_is_ignored(tmp_path):
    (tmp_path / "gateway.json").write_text("{not json")
    assert GatewayState(tmp_path).load("http://127.0.0.1:8700") is None
    (tmp_path / "gateway.json").write_text('{"registration": {"coordinator_url": "http://127.0.0.1:8700"}, "peers": {}}')
    assert GatewayState(tmp_path).load("http://127.0.0.1:8700") is None


def test_desired_config_of_the_hub(tmp_path):
    settings = build_settings(coordinator_url="http://127.0.0.1:8700", token="t", state_dir=str(tmp_path), listen_udp="0.0.0.0:51999")
    gateway = Gateway(settings)
    gateway.state.ensure()
    gateway.keypair = gateway.state.keypair()
    gateway.registration = REG
    from anex_agent.gateway.peers import PeerBook

    gateway.book = PeerBook.from_peer_set(PEERS)
    desired = gateway.desired()
    assert desired.address == "10.254.0.1/16" and desired.listen_port == 51999 and desired.mtu == 1420
    assert [p.allowed_ips for p in desired.peers] == [("10.254.0.2/32",)]
    assert desired.private_key == gateway.keypair.private
    assert (tmp_path / "private.key").stat().st_mode & 0o777 == 0o600
