"""The server side of SOCKS5 (RFC 1928) with username/password auth (RFC 1929). Sans-I/O.

No asyncio, socket or time here: :mod:`anex_agent.frontends.socks5` feeds the client's bytes
to a :class:`Socks5Connection`, writes what :meth:`~Socks5Connection.data_to_send` gives,
dials, and answers the request with :meth:`~Socks5Connection.reply`. Everything takes and
returns bytes and plain values, so it is tested without a network.

A connection goes through (RFC 1928 §3, §4, §6; RFC 1929 §2):

1. greeting ``VER=5 NMETHODS METHODS...`` -> method selection ``05 MM``: ``00`` (no
   authentication) when no credentials are configured, ``02`` (username/password) when they
   are; ``FF`` (no acceptable method) when the client does not offer it, then close;
2. with credentials: ``VER=1 ULEN UNAME PLEN PASSWD`` -> ``01 00`` (success) or ``01 01``
   (failure, then close);
3. request ``VER=5 CMD RSV ATYP DST.ADDR DST.PORT``: ``CONNECT`` to an IPv4 address, an IPv6
   address or a domain name becomes a :class:`ConnectRequest` (the name is *not* resolved
   here: the driver hands it to the Dialer, whose resolver asks the cluster's DNS for cluster
   names); ``UDP ASSOCIATE`` becomes an :class:`AssociateRequest` (DST is where the client
   says it will send its datagrams from, often 0.0.0.0:0: port 0 is allowed there);
   ``BIND`` is answered ``07`` (command not supported), an unknown address type ``08``
   (address type not supported), then close;
4. the driver dials (or opens the UDP relay) and calls :meth:`~Socks5Connection.reply`: ``00``
   (succeeded) starts the data phase (bytes the client sent ahead are in
   :attr:`~Socks5Connection.trailing_data`; for UDP ASSOCIATE the TCP connection then only
   says how long the association lives), any other code closes. :func:`reply_for` picks the
   code for a failed dial.

The UDP relay's datagram header (RFC 1928 §7) is :mod:`.socks5_udp_core`.

Malformed input raises :class:`Socks5ProtocolError` whose ``reason`` names the field that is
wrong (the version, the method count, the address type, the name's length...). The answer the
RFC allows at that point, if any, is queued first: after :class:`Refused` or the error, send
:meth:`~Socks5Connection.data_to_send` and close.
"""

from __future__ import annotations

import enum
import hmac
import ipaddress
from dataclasses import dataclass, field

from anex_agent import parse
from anex_agent.errors import (ConfigError, DialError, DialRefused, DialTimeout, DialUnreachable,
                               RemoteProtocolError, ResolveError)
from anex_agent.frontends.proxy_core import is_loopback

DEFAULT_LISTEN = ("127.0.0.1", 1080)  # the port IANA assigned to SOCKS
LISTEN_SOURCE = "ANEX_SOCKS_LISTEN"

VERSION = 0x05  # RFC 1928 §3
AUTH_VERSION = 0x01  # RFC 1929 §2: the sub-negotiation's version
METHOD_NO_AUTH = 0x00  # RFC 1928 §3
METHOD_USERPASS = 0x02  # RFC 1928 §3, RFC 1929
METHOD_NONE_ACCEPTABLE = 0xFF  # RFC 1928 §3
AUTH_SUCCESS, AUTH_FAILURE = 0x00, 0x01  # RFC 1929 §2: any non-zero STATUS is a failure


class Command(enum.IntEnum):
    """RFC 1928 §4: CMD."""

    CONNECT = 0x01
    BIND = 0x02
    UDP_ASSOCIATE = 0x03


class AddressType(enum.IntEnum):
    """RFC 1928 §4 / §5: ATYP."""

    IPV4 = 0x01
    DOMAIN = 0x03
    IPV6 = 0x04


class Reply(enum.IntEnum):
    """RFC 1928 §6: REP."""

    SUCCEEDED = 0x00
    GENERAL_FAILURE = 0x01
    NOT_ALLOWED = 0x02  # connection not allowed by ruleset
    NETWORK_UNREACHABLE = 0x03
    HOST_UNREACHABLE = 0x04
    CONNECTION_REFUSED = 0x05
    TTL_EXPIRED = 0x06
    COMMAND_NOT_SUPPORTED = 0x07
    ADDRESS_TYPE_NOT_SUPPORTED = 0x08


class Socks5ProtocolError(RemoteProtocolError):
    """The client broke RFC 1928 / RFC 1929; ``reason`` names the field (for the log, never the peer)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True)
class ConnectRequest:
    """``CONNECT`` to ``host`` (an IP address, IPv6 without brackets, or a name as sent) and ``port``."""

    host: str
    port: int
    address_type: AddressType


@dataclass(frozen=True)
class AssociateRequest:
    """``UDP ASSOCIATE``: the client will send datagrams from ``host:port`` (RFC 1928 §4: zeros
    when it does not know yet). A name is kept as sent; it limits nothing (the driver accepts
    datagrams from the control connection's address only)."""

    host: str
    port: int
    address_type: AddressType


@dataclass(frozen=True)
class Refused:
    """A well-formed exchange the server declines; its answer is queued. Send it, then close."""

    reason: str


class _NeedData:
    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA = _NeedData()  # next_event(): feed more bytes with receive_data()


@dataclass(frozen=True)
class SocksAuth:
    """The username and password (RFC 1929) the SOCKS5 proxy requires."""

    username: str
    password: str = field(repr=False)  # secret

    @classmethod
    def parse(cls, value: str, *, source: str = "ANEX_SOCKS_AUTH") -> SocksAuth:
        """``user:password`` -> SocksAuth; ConfigError naming ``source`` otherwise.

        RFC 1929 carries each in 1 to 255 bytes (UTF-8 here)."""
        user, sep, password = value.strip("\r\n").partition(":")
        accepted = "expected USER:PASSWORD, each 1 to 255 bytes in UTF-8"
        if not sep or not user or not password:
            raise ConfigError(source, f"{accepted} (neither may be empty)")
        if len(user.encode()) > 255 or len(password.encode()) > 255:
            raise ConfigError(source, f"{accepted} (RFC 1929 carries at most 255 bytes each)")
        return cls(user, password)

    def check(self, username: bytes, password: bytes) -> bool:
        """True when both match (compared in constant time)."""
        user_ok = hmac.compare_digest(username, self.username.encode())
        password_ok = hmac.compare_digest(password, self.password.encode())
        return user_ok and password_ok


def check_listener(host: str, auth: SocksAuth | None, *, source: str = LISTEN_SOURCE) -> None:
    """ConfigError naming ``source`` when ``host`` is beyond loopback and no credentials are set:
    anyone who reaches that address could use the mesh through the proxy."""
    if auth is None and not is_loopback(host):
        raise ConfigError(source, f"{host} is not a loopback address: a SOCKS5 proxy bound there needs credentials "
                                  "(set ANEX_SOCKS_AUTH_FILE or ANEX_SOCKS_AUTH to USER:PASSWORD), or bind 127.0.0.1")


class _State(enum.Enum):
    GREETING = "greeting"
    AUTH = "auth"
    REQUEST = "request"
    DIALLING = "dialling"  # a ConnectRequest or AssociateRequest was given out; waiting for reply()
    RELAY = "relay"
    CLOSED = "closed"


_ZERO_BOUND = ("0.0.0.0", 0)


class Socks5Connection:
    """One client connection, server side.

    Feed bytes with :meth:`receive_data`, then call :meth:`next_event` until it returns
    :data:`NEED_DATA`; after each call, write :meth:`data_to_send`. Events:

    * :class:`ConnectRequest`: dial it, then :meth:`reply` (``Reply.SUCCEEDED`` and the bound
      address, or the failure's code, :func:`reply_for`);
    * :class:`AssociateRequest`: open the UDP relay, then :meth:`reply` (``Reply.SUCCEEDED``
      and the relay's address, or a failure's code; ``COMMAND_NOT_SUPPORTED`` when the
      driver cannot carry datagrams);
    * :class:`Refused`: the answer is queued; send it and close.

    Raises :class:`Socks5ProtocolError` on malformed input (any answer allowed is queued).
    ``auth`` None: no authentication (method ``00``); else username/password (method ``02``).
    """

    def __init__(self, auth: SocksAuth | None = None) -> None:
        self.auth = auth
        self._state = _State.GREETING
        self._in = bytearray()
        self._out = bytearray()
        self.request: ConnectRequest | AssociateRequest | None = None

    @property
    def state(self) -> str:
        return self._state.value

    def receive_data(self, data: bytes) -> None:
        """Bytes from the client (``b""`` at EOF is ignored: the driver sees EOF itself)."""
        self._in += data

    def data_to_send(self) -> bytes:
        """The bytes to write to the client now (and forget)."""
        out, self._out = bytes(self._out), bytearray()
        return out

    @property
    def trailing_data(self) -> bytes:
        """Bytes the client sent after its request (the start of the data phase)."""
        return bytes(self._in)

    def next_event(self) -> ConnectRequest | AssociateRequest | Refused | _NeedData:
        """The next step, NEED_DATA when more bytes are needed; see the class docstring."""
        while True:
            if self._state is _State.GREETING:
                step = self._greeting()
            elif self._state is _State.AUTH:
                step = self._authenticate()
            elif self._state is _State.REQUEST:
                return self._request()
            else:
                return NEED_DATA
            if step is NEED_DATA:
                return NEED_DATA
            if isinstance(step, Refused):
                return self._close(step)

    def _close(self, event: Refused) -> Refused:
        self._state = _State.CLOSED
        return event

    def _fail(self, reason: str, answer: bytes = b"") -> Socks5ProtocolError:
        self._out += answer
        self._state = _State.CLOSED
        return Socks5ProtocolError(reason)

    # ---------------------------------------------------------------- RFC 1928 §3

    def _greeting(self) -> Refused | _NeedData | None:
        """Parse the greeting and choose the method; None when it moved on."""
        buf = self._in
        if not buf:
            return NEED_DATA
        if buf[0] != VERSION:
            raise self._fail(f"version {buf[0]} in the greeting (only SOCKS version 5 is served)")
        if len(buf) < 2:
            return NEED_DATA
        count = buf[1]
        if len(buf) < 2 + count:
            return NEED_DATA
        methods = set(buf[2:2 + count])
        del buf[:2 + count]
        wanted = METHOD_USERPASS if self.auth is not None else METHOD_NO_AUTH
        if wanted not in methods:
            self._out += bytes((VERSION, METHOD_NONE_ACCEPTABLE))
            need = "username/password (method 2)" if self.auth is not None else "no authentication (method 0)"
            offered = ", ".join(str(m) for m in sorted(methods)) or "none"
            return Refused(f"no acceptable authentication method: the client offered {offered}, "
                           f"the proxy needs {need}")
        self._out += bytes((VERSION, wanted))
        self._state = _State.AUTH if self.auth is not None else _State.REQUEST
        return None

    # ---------------------------------------------------------------- RFC 1929 §2

    def _authenticate(self) -> Refused | _NeedData | None:
        """Check the username and password; None when they match."""
        assert self.auth is not None
        buf = self._in
        if not buf:
            return NEED_DATA
        if buf[0] != AUTH_VERSION:
            raise self._fail(f"version {buf[0]} in the username/password request (RFC 1929 version is 1)",
                             bytes((AUTH_VERSION, AUTH_FAILURE)))
        if len(buf) < 2:
            return NEED_DATA
        ulen = buf[1]
        if len(buf) < 3 + ulen:
            return NEED_DATA
        plen = buf[2 + ulen]
        if len(buf) < 3 + ulen + plen:
            return NEED_DATA
        username, password = bytes(buf[2:2 + ulen]), bytes(buf[3 + ulen:3 + ulen + plen])
        del buf[:3 + ulen + plen]
        if not self.auth.check(username, password):
            self._out += bytes((AUTH_VERSION, AUTH_FAILURE))
            return Refused("wrong username or password")
        self._out += bytes((AUTH_VERSION, AUTH_SUCCESS))
        self._state = _State.REQUEST
        return None

    # ---------------------------------------------------------------- RFC 1928 §4, §5

    def _request(self) -> ConnectRequest | AssociateRequest | Refused | _NeedData:
        buf = self._in
        if not buf:
            return NEED_DATA
        if buf[0] != VERSION:
            raise self._fail(f"version {buf[0]} in the request (only SOCKS version 5 is served)",
                             encode_reply(Reply.GENERAL_FAILURE))
        if len(buf) < 5:
            return NEED_DATA
        command, atyp = buf[1], buf[3]  # buf[2] is RSV: reserved, ignored
        if atyp == AddressType.IPV4:
            end = 4 + 4
        elif atyp == AddressType.IPV6:
            end = 4 + 16
        elif atyp == AddressType.DOMAIN:
            if buf[4] == 0:
                raise self._fail("domain name of length 0 in the request", encode_reply(Reply.GENERAL_FAILURE))
            end = 5 + buf[4]
        else:
            # the rest of the request cannot be parsed: answer and close (RFC 1928 §6: X'08')
            self._out += encode_reply(Reply.ADDRESS_TYPE_NOT_SUPPORTED)
            return self._close(Refused(f"address type {atyp} is not supported (1: IPv4, 3: domain name, 4: IPv6)"))
        if len(buf) < end + 2:
            return NEED_DATA
        raw = bytes(buf[4:end])
        port = int.from_bytes(buf[end:end + 2], "big")
        del buf[:end + 2]
        if command not in (Command.CONNECT, Command.UDP_ASSOCIATE):
            self._out += encode_reply(Reply.COMMAND_NOT_SUPPORTED)
            try:
                name = Command(command).name.replace("_", " ")
            except ValueError:
                name = f"command {command}"
            return self._close(Refused(f"{name} is not supported (only CONNECT and UDP ASSOCIATE)"))
        if atyp == AddressType.IPV4:
            host = str(ipaddress.IPv4Address(raw))
        elif atyp == AddressType.IPV6:
            host = str(ipaddress.IPv6Address(raw))
        else:
            host = self._domain(raw[1:])
        if command == Command.UDP_ASSOCIATE:  # where the client sends from: zeros mean "not known yet"
            self.request = AssociateRequest(host, port, AddressType(atyp))
            self._state = _State.DIALLING
            return self.request
        if port == 0:
            raise self._fail(f"destination port 0 for {host!r} in the request", encode_reply(Reply.GENERAL_FAILURE))
        self.request = ConnectRequest(host, port, AddressType(atyp))
        self._state = _State.DIALLING
        return self.request

    def _domain(self, raw: bytes) -> str:
        try:
            return parse.host(raw.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            shown = raw[:64].decode("ascii", "backslashreplace")
            raise self._fail(f"domain name {shown!r} in the request is not a host name (letters, digits, '-', '.')",
                             encode_reply(Reply.HOST_UNREACHABLE)) from None

    # ---------------------------------------------------------------- RFC 1928 §6

    def reply(self, code: Reply, bound: tuple[str, int] | None = None) -> None:
        """Answer the request: ``SUCCEEDED`` with ``bound`` (the proxy's own end of the outbound
        connection, 0.0.0.0:0 when unknown; for UDP ASSOCIATE the relay's address, where the
        client sends its datagrams) starts the data phase; any other code ends the connection
        (send :meth:`data_to_send`, then close)."""
        if self._state is not _State.DIALLING:
            raise RuntimeError(f"reply() in state {self._state.value}: only after a ConnectRequest or AssociateRequest")
        self._out += encode_reply(code, bound)
        self._state = _State.RELAY if code is Reply.SUCCEEDED else _State.CLOSED


def encode_reply(code: Reply, bound: tuple[str, int] | None = None) -> bytes:
    """``VER REP RSV ATYP BND.ADDR BND.PORT`` (RFC 1928 §6) for ``bound`` (an IP address and port)."""
    host, port = bound or _ZERO_BOUND
    address = ipaddress.ip_address(host.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    atyp = AddressType.IPV4 if address.version == 4 else AddressType.IPV6
    return bytes((VERSION, code, 0x00, atyp)) + address.packed + port.to_bytes(2, "big")


def reply_for(err: DialError) -> Reply:
    """The REP code for a failed dial (RFC 1928 §6), as go-socks5 (wireproxy's) picks it:
    a name that does not resolve or a silent host is "host unreachable", a reset is
    "connection refused", no route is "network unreachable"."""
    if isinstance(err, DialRefused):
        return Reply.CONNECTION_REFUSED
    if isinstance(err, DialUnreachable):
        return Reply.NETWORK_UNREACHABLE
    if isinstance(err, (ResolveError, DialTimeout)):
        return Reply.HOST_UNREACHABLE
    return Reply.GENERAL_FAILURE
