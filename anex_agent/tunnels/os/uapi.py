"""Client for the WireGuard cross-platform userspace API (UAPI), as spoken by wireguard-go.

Protocol (https://www.wireguard.com/xplatform/, "Configuration Protocol"): a UNIX
stream socket at ``/var/run/wireguard/<ifname>.sock``. A request is an operation line
(``get=1`` or ``set=1``) followed by ``key=value`` lines and ends with an empty line.
Keys are lowercase hex (64 characters). The response to ``get`` is ``key=value`` lines
in the same vocabulary; every response ends with ``errno=N`` and an empty line
(``errno=0`` is success, otherwise an errno value, sign not guaranteed).

Set keys, in order: device keys first (``private_key``, ``listen_port``, ``fwmark``,
``replace_peers``), then per peer ``public_key`` opening a peer section followed by
``remove``, ``update_only``, ``preshared_key``, ``endpoint``,
``persistent_keepalive_interval``, ``replace_allowed_ips``, ``allowed_ip`` (repeated),
``protocol_version``.

This module has a pure core (:func:`encode_get`, :func:`encode_set`,
:func:`parse_response`) and a thin asyncio driver (:func:`get_device`,
:func:`set_device`). The private key appears only in the bytes sent to the socket.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from anex_agent import parse
from anex_agent.errors import EngineError, LocalProtocolError, RemoteProtocolError

#: Directory of UAPI sockets on Linux (xplatform: "/var/run/wireguard/wg0.sock").
SOCKET_DIR = "/var/run/wireguard"
KEY_LEN = 32


def socket_path(ifname: str, directory: str = SOCKET_DIR) -> str:
    return os.path.join(directory, f"{ifname}.sock")


# ---------------------------------------------------------------- models


@dataclass(frozen=True)
class UapiPeer:
    """A peer as reported by ``get=1``. Times are the UNIX seconds/nanoseconds of the last handshake (0: never)."""

    public_key: bytes
    endpoint: str | None = None
    persistent_keepalive: int = 0
    allowed_ips: tuple[str, ...] = ()
    preshared_key: bytes | None = field(default=None, repr=False)
    last_handshake_sec: int = 0
    last_handshake_nsec: int = 0
    rx_bytes: int = 0
    tx_bytes: int = 0
    protocol_version: int = 0

    @property
    def last_handshake(self) -> float | None:
        if not self.last_handshake_sec and not self.last_handshake_nsec:
            return None
        return self.last_handshake_sec + self.last_handshake_nsec / 1e9


@dataclass(frozen=True)
class UapiDevice:
    """A device as reported by ``get=1``."""

    private_key: bytes | None = field(default=None, repr=False)
    listen_port: int = 0
    fwmark: int = 0
    peers: tuple[UapiPeer, ...] = ()


@dataclass(frozen=True)
class PeerChange:
    """One peer section of a ``set=1`` request.

    ``remove``: delete the peer (nothing else is sent). ``update_only``: only change an
    existing peer. ``preshared_key``: 32 bytes to set, ``b""`` to clear (all-zero key),
    ``None`` to leave alone. ``endpoint``: an IP literal ``HOST:PORT`` (IPv6 in brackets);
    UAPI does not resolve names. ``persistent_keepalive`` ``None`` leaves it alone.
    ``replace_allowed_ips``: the list given replaces the current one (else it is added).
    """

    public_key: bytes
    remove: bool = False
    update_only: bool = False
    preshared_key: bytes | None = field(default=None, repr=False)
    endpoint: str | None = None
    persistent_keepalive: int | None = None
    replace_allowed_ips: bool = False
    allowed_ips: tuple[str, ...] = ()


# ---------------------------------------------------------------- pure core: encoding


def encode_get() -> bytes:
    """The bytes of a ``get=1`` request."""
    return b"get=1\n\n"


def _hex_key(key: bytes, what: str) -> str:
    if not isinstance(key, bytes) or len(key) != KEY_LEN:
        raise LocalProtocolError(f"{what} must be {KEY_LEN} bytes")
    return key.hex()


def _check_endpoint(endpoint: str) -> str:
    """An ``IP:PORT`` / ``[IPv6]:PORT`` endpoint as UAPI takes it (no names); LocalProtocolError otherwise."""
    try:
        parse.host_port(endpoint)
    except ValueError as err:
        raise LocalProtocolError(f"endpoint {endpoint!r} {err}") from None
    try:
        parse.ip_port(endpoint)
    except ValueError:
        raise LocalProtocolError(f"endpoint {endpoint!r}: UAPI needs an IP address, resolve names first") from None
    return endpoint


def encode_set(
    *,
    private_key: bytes | None = None,
    listen_port: int | None = None,
    fwmark: int | None = None,
    replace_peers: bool = False,
    peers: Iterable[PeerChange] = (),
) -> bytes:
    """The bytes of a ``set=1`` request. Raises LocalProtocolError for values UAPI cannot carry."""
    lines = ["set=1"]
    if private_key is not None:
        lines.append(f"private_key={_hex_key(private_key, 'private_key')}")
    if listen_port is not None:
        if not 0 <= listen_port <= 65535:
            raise LocalProtocolError(f"listen_port {listen_port} is outside 0..65535")
        lines.append(f"listen_port={listen_port}")
    if fwmark is not None:
        if not 0 <= fwmark < 2**32:
            raise LocalProtocolError(f"fwmark {fwmark} is outside 0..2^32-1")
        lines.append(f"fwmark={fwmark}")
    if replace_peers:
        lines.append("replace_peers=true")
    for peer in peers:
        lines.append(f"public_key={_hex_key(peer.public_key, 'public_key')}")
        if peer.remove:
            lines.append("remove=true")
            continue
        if peer.update_only:
            lines.append("update_only=true")
        if peer.preshared_key is not None:
            psk = peer.preshared_key or bytes(KEY_LEN)
            lines.append(f"preshared_key={_hex_key(psk, 'preshared_key')}")
        if peer.endpoint is not None:
            lines.append(f"endpoint={_check_endpoint(peer.endpoint)}")
        if peer.persistent_keepalive is not None:
            if not 0 <= peer.persistent_keepalive <= 65535:
                raise LocalProtocolError(f"persistent_keepalive {peer.persistent_keepalive} is outside 0..65535")
            lines.append(f"persistent_keepalive_interval={peer.persistent_keepalive}")
        if peer.replace_allowed_ips:
            lines.append("replace_allowed_ips=true")
        for cidr in peer.allowed_ips:
            try:
                net = parse.cidr_text(cidr)
            except ValueError:
                raise LocalProtocolError(f"allowed_ip {cidr!r} is not a CIDR network") from None
            lines.append(f"allowed_ip={net}")
    return ("\n".join(lines) + "\n\n").encode("ascii")


# ---------------------------------------------------------------- pure core: decoding


def _parse_lines(data: bytes) -> list[tuple[str, str]]:
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise RemoteProtocolError("UAPI response is not ASCII") from None
    if not text.endswith("\n\n"):
        raise RemoteProtocolError("UAPI response does not end with an empty line")
    pairs = []
    for line in text[:-2].split("\n"):
        key, sep, value = line.partition("=")
        if not sep or not key:
            raise RemoteProtocolError(f"UAPI response line {line!r} is not key=value")
        pairs.append((key, value))
    return pairs


def _int(key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise RemoteProtocolError(f"UAPI {key}={value!r} is not an integer") from None


def _key(key: str, value: str) -> bytes:
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise RemoteProtocolError(f"UAPI {key} is not hex") from None
    if len(raw) != KEY_LEN:
        raise RemoteProtocolError(f"UAPI {key} is {len(raw)} bytes, expected {KEY_LEN}")
    return raw


class UapiError(EngineError):
    """The UAPI server answered ``errno=N`` with N != 0."""

    def __init__(self, errno: int, operation: str) -> None:
        self.errno = abs(errno)
        super().__init__(f"UAPI {operation} failed: errno={errno} ({os.strerror(self.errno)})")


def parse_response(data: bytes, operation: str = "get") -> UapiDevice:
    """Decode a complete response (up to and including the final empty line).

    Returns the device for ``get`` (an empty UapiDevice for ``set``). Raises UapiError
    when ``errno`` is non-zero, RemoteProtocolError for malformed input. Unknown keys are
    ignored (forward compatibility, as wg(8) does).
    """
    pairs = _parse_lines(data)
    if not pairs or pairs[-1][0] != "errno":
        raise RemoteProtocolError("UAPI response does not end with errno=")
    errno = _int("errno", pairs[-1][1])
    if errno != 0:
        raise UapiError(errno, operation)
    device: dict = {"peers": []}
    peer: dict | None = None

    def close_peer() -> None:
        if peer is not None:
            peer["allowed_ips"] = tuple(peer.get("allowed_ips", ()))
            device["peers"].append(UapiPeer(**peer))

    for key, value in pairs[:-1]:
        if key == "public_key":
            close_peer()
            peer = {"public_key": _key(key, value), "allowed_ips": []}
        elif peer is None:
            if key == "private_key":
                device["private_key"] = _key(key, value)
            elif key in ("listen_port", "fwmark"):
                device[key] = _int(key, value)
        elif key == "preshared_key":
            psk = _key(key, value)
            peer["preshared_key"] = psk if any(psk) else None
        elif key == "endpoint":
            peer["endpoint"] = value or None
        elif key == "persistent_keepalive_interval":
            peer["persistent_keepalive"] = _int(key, value)
        elif key == "allowed_ip":
            peer["allowed_ips"].append(value)
        elif key in ("last_handshake_time_sec", "last_handshake_time_nsec", "rx_bytes", "tx_bytes", "protocol_version"):
            name = key.replace("_time", "")
            peer[name] = _int(key, value)
    close_peer()
    return UapiDevice(private_key=device.get("private_key"), listen_port=device.get("listen_port", 0),
                      fwmark=device.get("fwmark", 0), peers=tuple(device["peers"]))


# ---------------------------------------------------------------- asyncio driver

#: Generous bound on one exchange; wireguard-go answers in microseconds.
EXCHANGE_TIMEOUT = 10.0
MAX_RESPONSE = 16 * 1024 * 1024
CLOSE_TIMEOUT = 1.0


async def _exchange(path: str, request: bytes, operation: str) -> UapiDevice:
    """One request and its response, :data:`EXCHANGE_TIMEOUT` s at most for the connection and as
    much for the exchange. ``asyncio.timeout``, not ``wait_for``: a cancellation of the caller that
    comes as the connection opens is never lost (``wait_for`` of Python 3.11 could return instead)."""
    import asyncio

    try:
        async with asyncio.timeout(EXCHANGE_TIMEOUT):
            reader, writer = await asyncio.open_unix_connection(path)
    except (OSError, TimeoutError) as err:
        raise EngineError(f"cannot connect to the UAPI socket {path}: {err or 'timeout'}") from None
    try:
        async with asyncio.timeout(EXCHANGE_TIMEOUT):
            writer.write(request)
            await writer.drain()
            chunks = bytearray()
            while not (chunks.endswith(b"\n\n") and (chunks.startswith(b"errno=") or b"\nerrno=" in chunks)):
                data = await reader.read(65536)
                if not data:
                    raise EngineError(f"UAPI socket {path} closed before the response ended")
                chunks += data
                if len(chunks) > MAX_RESPONSE:
                    raise EngineError(f"UAPI response from {path} is larger than {MAX_RESPONSE} bytes")
        return parse_response(bytes(chunks), operation)
    except (OSError, TimeoutError) as err:
        raise EngineError(f"UAPI {operation} on {path} failed: {err or 'timeout'}") from None
    finally:
        writer.close()
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT):
                await writer.wait_closed()
        except (OSError, TimeoutError):
            pass


async def get_device(path: str) -> UapiDevice:
    """Run ``get=1`` on the socket at ``path``."""
    return await _exchange(path, encode_get(), "get")


async def set_device(path: str, request: bytes) -> None:
    """Send a ``set=1`` request made by :func:`encode_set`; raises UapiError on errno != 0."""
    if request.strip() == b"set=1":
        return
    await _exchange(path, request, "set")
