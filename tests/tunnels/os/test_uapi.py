"""UAPI (wireguard.com/xplatform) encoding and decoding, no sockets."""

from __future__ import annotations

import pytest

from anex_agent.errors import LocalProtocolError, RemoteProtocolError
from anex_agent.tunnels.os import uapi
from anex_agent.tunnels.os.uapi import PeerChange, UapiError, encode_set, parse_response

K1, K2, PRIV = bytes([1] * 32), bytes([2] * 32), bytes(range(32))


def test_get_request():
    assert uapi.encode_get() == b"get=1\n\n"


def test_set_request_in_protocol_order():
    wire = encode_set(
        private_key=PRIV, listen_port=51820, replace_peers=True,
        peers=[
            PeerChange(public_key=K1, endpoint="192.0.2.1:51820", persistent_keepalive=25,
                       replace_allowed_ips=True, allowed_ips=("10.254.0.0/16", "10.96.0.1/12")),
            PeerChange(public_key=K2, remove=True, endpoint="192.0.2.9:1"),
        ],
    )
    assert wire.decode().split("\n") == [
        "set=1",
        f"private_key={PRIV.hex()}",
        "listen_port=51820",
        "replace_peers=true",
        f"public_key={K1.hex()}",
        "endpoint=192.0.2.1:51820",
        "persistent_keepalive_interval=25",
        "replace_allowed_ips=true",
        "allowed_ip=10.254.0.0/16",
        "allowed_ip=10.96.0.0/12",  # host bits cleared
        f"public_key={K2.hex()}",
        "remove=true",  # nothing else for a removed peer
        "",
        "",
    ]


def test_preshared_key_clear_is_all_zero():
    wire = encode_set(peers=[PeerChange(public_key=K1, preshared_key=b"")]).decode()
    assert f"preshared_key={'00' * 32}" in wire


def test_private_key_never_in_repr():
    device = uapi.UapiDevice(private_key=PRIV)
    assert PRIV.hex() not in repr(device) and "private_key" not in repr(device)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"private_key": b"short"}, "private_key must be 32 bytes"),
        ({"listen_port": 70000}, "listen_port"),
        ({"peers": [PeerChange(public_key=K1, endpoint="gw.example.com:51820")]}, "resolve names first"),
        ({"peers": [PeerChange(public_key=K1, endpoint="fd00::1:51820")]}, "brackets"),
        ({"peers": [PeerChange(public_key=K1, endpoint="192.0.2.1")]}, "HOST:PORT"),
        ({"peers": [PeerChange(public_key=K1, endpoint="192.0.2.1:²")]}, "HOST:PORT"),
        ({"peers": [PeerChange(public_key=K1, endpoint="192.0.2.1:٥١٨٢٠")]}, "HOST:PORT"),
        ({"peers": [PeerChange(public_key=K1, endpoint="[192.0.2.1]:51820")]}, "HOST:PORT"),
        ({"peers": [PeerChange(public_key=K1, allowed_ips=("10.0.0.0/٨",))]}, "CIDR"),
        ({"peers": [PeerChange(public_key=K1, allowed_ips=("10.0.0.0/40",))]}, "CIDR"),
        ({"peers": [PeerChange(public_key=K1, persistent_keepalive=-1)]}, "persistent_keepalive"),
    ],
)
def test_set_rejects_what_uapi_cannot_carry(kwargs, message):
    with pytest.raises(LocalProtocolError, match=message):
        encode_set(**kwargs)


def test_ipv6_endpoint_in_brackets_accepted():
    assert b"endpoint=[fd00::1]:51820\n" in encode_set(peers=[PeerChange(public_key=K1, endpoint="[fd00::1]:51820")])


GET_RESPONSE = (
    f"private_key={PRIV.hex()}\n"
    "listen_port=51820\n"
    f"public_key={K1.hex()}\n"
    f"preshared_key={'00' * 32}\n"
    "protocol_version=1\n"
    "endpoint=192.0.2.1:40000\n"
    "last_handshake_time_sec=1700000000\n"
    "last_handshake_time_nsec=500000000\n"
    "tx_bytes=100\n"
    "rx_bytes=200\n"
    "persistent_keepalive_interval=25\n"
    "allowed_ip=10.254.0.5/32\n"
    "allowed_ip=10.96.0.0/12\n"
    f"public_key={K2.hex()}\n"
    f"preshared_key={'ab' * 32}\n"
    "last_handshake_time_sec=0\n"
    "last_handshake_time_nsec=0\n"
    "some_future_key=whatever\n"
    "errno=0\n\n"
).encode()


def test_parse_get_response():
    device = parse_response(GET_RESPONSE)
    assert device.private_key == PRIV and device.listen_port == 51820
    first, second = device.peers
    assert first.public_key == K1 and first.endpoint == "192.0.2.1:40000"
    assert first.allowed_ips == ("10.254.0.5/32", "10.96.0.0/12")
    assert first.preshared_key is None  # all-zero means none
    assert (first.rx_bytes, first.tx_bytes, first.persistent_keepalive) == (200, 100, 25)
    assert first.last_handshake == pytest.approx(1700000000.5)
    assert second.last_handshake is None and second.preshared_key == bytes([0xAB] * 32)
    assert second.allowed_ips == () and second.endpoint is None


def test_parse_set_response_ok():
    assert parse_response(b"errno=0\n\n", "set").peers == ()


@pytest.mark.parametrize("errno", ["-22", "22"])
def test_errno_raises_with_its_meaning(errno):
    with pytest.raises(UapiError, match="Invalid argument") as info:
        parse_response(f"errno={errno}\n\n".encode(), "set")
    assert info.value.errno == 22


@pytest.mark.parametrize(
    "data, message",
    [
        (b"listen_port=1\n", "empty line"),
        (b"listen_port=1\n\n", "errno"),
        (b"garbage\nerrno=0\n\n", "not key=value"),
        (b"listen_port=x\nerrno=0\n\n", "not an integer"),
        (b"public_key=zz\nerrno=0\n\n", "not hex"),
        (b"public_key=0101\nerrno=0\n\n", "expected 32"),
        ("listen_port=\u00e9\nerrno=0\n\n".encode(), "ASCII"),
    ],
)
def test_malformed_responses(data, message):
    with pytest.raises(RemoteProtocolError, match=message):
        parse_response(data)


def test_roundtrip_through_a_fake_socket(tmp_path):
    """The asyncio driver against a UNIX socket server speaking the protocol."""
    import asyncio

    path = str(tmp_path / "anxtest.sock")
    seen: list[bytes] = []

    async def handle(reader, writer):
        request = await reader.readuntil(b"\n\n")
        seen.append(request)
        writer.write(GET_RESPONSE if request == b"get=1\n\n" else b"errno=-22\n\n")
        await writer.drain()
        writer.close()

    async def scenario():
        server = await asyncio.start_unix_server(handle, path)
        async with server:
            device = await uapi.get_device(path)
            with pytest.raises(UapiError):
                await uapi.set_device(path, encode_set(listen_port=1))
            await uapi.set_device(path, b"set=1\n\n")  # empty change: not sent at all
        return device

    device = asyncio.run(scenario())
    assert device.listen_port == 51820
    assert seen == [b"get=1\n\n", b"set=1\nlisten_port=1\n\n"]


def test_driver_error_when_no_socket(tmp_path):
    import asyncio

    from anex_agent.errors import EngineError

    with pytest.raises(EngineError, match="cannot connect"):
        asyncio.run(uapi.get_device(str(tmp_path / "none.sock")))
