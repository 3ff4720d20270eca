"""What the wireguard-go and kernel engines send, computed from a device dump and a desired config (pure)."""

from __future__ import annotations

import base64

import pytest

from anex_agent.wire.keys import encode_key
from anex_agent.tunnels.engines import kernel, wireguard_go
from anex_agent.tunnels.os import uapi
from anex_agent.tunnels.engines.config import DesiredConfig, PeerConfig

PRIV = bytes(range(32))
K1, K2, K3 = bytes([1] * 32), bytes([2] * 32), bytes([3] * 32)
B1, B2, B3 = encode_key(K1), encode_key(K2), encode_key(K3)


def desired(*peers, port=51820, priv=PRIV):
    return DesiredConfig(private_key=priv, listen_port=port, address="10.254.0.1/16", mtu=1420, peers=tuple(peers))


def device(*peers, port=51820, priv=PRIV):
    return uapi.UapiDevice(private_key=priv, listen_port=port, peers=tuple(peers))


def test_identical_state_sends_an_empty_set():
    dev = device(uapi.UapiPeer(public_key=K1, endpoint="192.0.2.1:5", allowed_ips=("10.254.0.2/32",), persistent_keepalive=25))
    want = desired(PeerConfig(B1, "192.0.2.1:5", ("10.254.0.2/32",), 25))
    assert wireguard_go.encode_apply(dev, want) == b"set=1\n\n"
    assert kernel.netlink_changes(dev, want) == ({}, [])


def test_fresh_device_gets_key_port_and_peers():
    wire = wireguard_go.encode_apply(device(port=0, priv=None), desired(PeerConfig(B1, None, ("10.254.0.2/32",), 0))).decode()
    assert f"private_key={PRIV.hex()}" in wire and "listen_port=51820" in wire
    assert f"public_key={K1.hex()}\npersistent_keepalive_interval=0\nreplace_allowed_ips=true\nallowed_ip=10.254.0.2/32" in wire


def test_diff_removes_updates_and_adds_only_what_changed():
    dev = device(
        uapi.UapiPeer(public_key=K1, allowed_ips=("10.254.0.2/32",)),
        uapi.UapiPeer(public_key=K2, allowed_ips=("10.254.0.3/32",), preshared_key=bytes([9] * 32)),
    )
    want = desired(PeerConfig(B2, None, ("10.254.0.3/32",), 0), PeerConfig(B3, None, ("10.254.0.4/32",), 0))
    wire = wireguard_go.encode_apply(dev, want).decode()
    assert "private_key" not in wire and "listen_port" not in wire
    assert f"public_key={K1.hex()}\nremove=true" in wire
    assert f"public_key={K2.hex()}\npreshared_key={'00' * 32}" in wire  # psk dropped -> cleared
    assert f"public_key={K3.hex()}" in wire
    dev_kw, peers = kernel.netlink_changes(dev, want)
    assert dev_kw == {}
    assert peers[0] == {"public_key": B1, "remove": True}
    by_key = {p["public_key"]: p for p in peers[1:]}
    assert set(by_key) == {B2, B3}
    assert by_key[B2]["preshared_key"] == kernel.ZERO_KEY_B64
    assert by_key[B3]["replace_allowed_ips"] is True and "preshared_key" not in by_key[B3]


def test_node_side_keeps_random_port():
    dev = device(port=41234)
    assert wireguard_go.encode_apply(dev, desired(port=None)) == b"set=1\n\n"


def test_kernel_endpoint_is_split():
    _, peers = kernel.netlink_changes(device(), desired(PeerConfig(B1, "[fd00::1]:51820", ("10.0.0.0/8",), 25)))
    assert (peers[0]["endpoint_addr"], peers[0]["endpoint_port"]) == ("fd00::1", 51820)


def test_status_from_device():
    dev = device(uapi.UapiPeer(public_key=K1, endpoint="192.0.2.1:5", rx_bytes=3, tx_bytes=4,
                               last_handshake_sec=1700000000, allowed_ips=("10.254.0.2/32",)))
    status = wireguard_go.status_from_device("wireguard-go", "anxtest", dev, True)
    assert status.peer(B1).last_handshake == 1700000000
    doc = status.to_dict()
    assert doc["peers"][0]["rx_bytes"] == 3 and doc["listen_port"] == 51820
    assert "private" not in str(doc)


def _netlink_dump(peers_attrs):
    """A WG_CMD_GET_DEVICE reply encoded and decoded by pyroute2's own message class."""
    from pyroute2.netlink.generic.wireguard import wgmsg

    msg = wgmsg()
    msg["cmd"], msg["version"] = 0, 1
    msg["attrs"] = [
        ["WGDEVICE_A_IFNAME", "anxk0"],
        ["WGDEVICE_A_PRIVATE_KEY", {"value": base64.b64encode(PRIV).decode()}],
        ["WGDEVICE_A_LISTEN_PORT", 51820],
        ["WGDEVICE_A_PEERS", [{"attrs": a} for a in peers_attrs]],
    ]
    msg.encode()
    decoded = wgmsg(msg.data)
    decoded.decode()
    return decoded


def test_kernel_dump_is_converted_like_uapi():
    dump = _netlink_dump([[
        ["WGPEER_A_PUBLIC_KEY", {"value": B1}],
        ["WGPEER_A_PRESHARED_KEY", {"value": kernel.ZERO_KEY_B64}],
        ["WGPEER_A_ENDPOINT", {"addr": "192.0.2.1", "port": 40000}],
        ["WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL", 25],
        ["WGPEER_A_RX_BYTES", 100],
        ["WGPEER_A_TX_BYTES", 50],
        ["WGPEER_A_ALLOWEDIPS", [{"attrs": [["WGALLOWEDIP_A_FAMILY", 2], ["WGALLOWEDIP_A_IPADDR", bytes([10, 254, 0, 2])],
                                            ["WGALLOWEDIP_A_CIDR_MASK", 32]]}]],
    ]])
    dev = kernel.device_from_netlink([dump])
    assert dev.private_key == PRIV and dev.listen_port == 51820
    (peer,) = dev.peers
    assert peer.public_key == K1 and peer.endpoint == "192.0.2.1:40000" and peer.preshared_key is None
    assert (peer.rx_bytes, peer.tx_bytes, peer.persistent_keepalive) == (100, 50, 25)
    assert peer.allowed_ips == ("10.254.0.2/32",)
    # and the diff against the same config is empty
    same = desired(PeerConfig(B1, "192.0.2.1:40000", ("10.254.0.2/32",), 25))
    assert kernel.netlink_changes(dev, same) == ({}, [])


def test_kernel_unsupported_here_says_why():
    support = kernel.KernelEngine.is_supported()
    assert isinstance(support.reason, str) and support.reason
    if not support.ok:
        assert "wireguard" in support.reason or "CAP_NET_ADMIN" in support.reason or "netlink" in support.reason


def test_kernel_netlink_errors_become_engine_errors():
    """Without the wireguard genl family (or without privileges) reading a device is an EngineError, not a netlink crash."""
    from anex_agent.errors import EngineError

    with pytest.raises(EngineError, match="anxnone0"):
        kernel._wg_info("anxnone0")


def test_a_keepalive_turns_each_named_peers_interval_off_and_on_again():
    """WireGuard sends a keepalive when a peer's persistent keepalive goes from 0 to another value
    (wireguard-go's pkaOn, the kernel's set_peer): the interval goes to 0 and back, or, for a peer
    with none, to 1 s and back to 0; peers not named are not touched, none is created."""
    dev = device(uapi.UapiPeer(public_key=K1, persistent_keepalive=25), uapi.UapiPeer(public_key=K2),
                 uapi.UapiPeer(public_key=K3, persistent_keepalive=7))
    wire = wireguard_go.keepalive_request(dev, [B1, B2, encode_key(bytes(32))]).decode()
    assert wire == (f"set=1\npublic_key={K1.hex()}\nupdate_only=true\npersistent_keepalive_interval=0\n"
                    f"public_key={K1.hex()}\nupdate_only=true\npersistent_keepalive_interval=25\n"
                    f"public_key={K2.hex()}\nupdate_only=true\npersistent_keepalive_interval=1\n"
                    f"public_key={K2.hex()}\nupdate_only=true\npersistent_keepalive_interval=0\n\n")
    assert kernel.keepalive_peers(dev, {B3}) == [
        {"public_key": B3, "update_only": True, "persistent_keepalive": 0},
        {"public_key": B3, "update_only": True, "persistent_keepalive": 7},
    ]
    assert wireguard_go.keepalive_request(dev, [encode_key(bytes(32))]) is None  # not a peer: nothing to send
    assert kernel.keepalive_peers(device(), [B1]) == []


async def test_the_kernel_keepalive_puts_each_interval_back_when_a_write_fails(monkeypatch):
    """The kernel takes the two settings of a peer in two messages: when one fails, each peer's own
    interval is set once more, so no peer is left without its persistent keepalive."""
    from anex_agent.errors import EngineError

    writes = []

    def wg_set(ifname, device_kwargs, peers):
        writes.append(peers)
        if len(writes) == 1:
            raise EngineError("cannot configure WireGuard device: no buffer space")
    monkeypatch.setattr(kernel, "_wg_info", lambda ifname: device(uapi.UapiPeer(public_key=K1, persistent_keepalive=25)))
    monkeypatch.setattr(kernel, "_wg_set", wg_set)
    engine = kernel.KernelEngine(ifname="anxtest3")
    assert await engine.send_keepalive([B1]) is False  # not started
    engine._started = True
    assert await engine.send_keepalive([B1]) is False
    assert writes == [kernel.keepalive_peers(device(uapi.UapiPeer(public_key=K1, persistent_keepalive=25)), [B1]),
                      [{"public_key": B1, "update_only": True, "persistent_keepalive": 25}]]
    assert await engine.send_keepalive([B1]) is True and len(writes) == 3
