"""The SOCKS5 core (RFC 1928, RFC 1929) without a network: every step, every reply code, malformed input."""

from __future__ import annotations

import ast
import inspect
import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from anex_agent.errors import ConfigError, DialError, DialRefused, DialTimeout, DialUnreachable, ResolveError
from anex_agent.frontends import socks5_core as core
from anex_agent.frontends.socks5_core import AddressType, NEED_DATA, Reply

AUTH = core.SocksAuth("alice", "s3cret")
NO_AUTH_GREETING = bytes([5, 1, 0])
USERPASS_GREETING = bytes([5, 2, 0, 2])


def userpass(user: bytes, password: bytes, version: int = 1) -> bytes:
    return bytes([version, len(user)]) + user + bytes([len(password)]) + password


def request(host: str, port: int, command: int = 1) -> bytes:
    """A request as a client encodes it: an IP literal as IPv4/IPv6, anything else as a domain name."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raw = host.encode()
        return bytes([5, command, 0, 3, len(raw)]) + raw + port.to_bytes(2, "big")
    atyp = 1 if address.version == 4 else 4
    return bytes([5, command, 0, atyp]) + address.packed + port.to_bytes(2, "big")


def feed(conn: core.Socks5Connection, data: bytes, *, one_byte_at_a_time: bool = False):
    """Feed ``data`` and return (events other than NEED_DATA, bytes to send)."""
    events, out = [], b""
    chunks = [data[i:i + 1] for i in range(len(data))] if one_byte_at_a_time else [data]
    for chunk in chunks:
        conn.receive_data(chunk)
        while (event := conn.next_event()) is not NEED_DATA:
            events.append(event)
            if isinstance(event, core.Refused) or conn.state in ("dialling", "closed"):
                break
        out += conn.data_to_send()
    return events, out


def test_core_does_no_io():
    tree = ast.parse(inspect.getsource(core))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & {"asyncio", "socket", "time"}


@pytest.mark.parametrize("one_byte_at_a_time", [False, True])
@pytest.mark.parametrize(
    "host, atyp",
    [("10.96.0.10", AddressType.IPV4), ("fd00::a", AddressType.IPV6),
     ("echo.default.svc.cluster.local", AddressType.DOMAIN)],
)
def test_connect_without_auth(host, atyp, one_byte_at_a_time):
    conn = core.Socks5Connection()
    events, out = feed(conn, NO_AUTH_GREETING + request(host, 8080), one_byte_at_a_time=one_byte_at_a_time)
    assert out == bytes([5, 0])  # RFC 1928 §3: method 00 chosen
    assert events == [core.ConnectRequest(host, 8080, atyp)]
    assert conn.state == "dialling"
    conn.reply(Reply.SUCCEEDED, ("10.77.0.5", 40000))
    assert conn.data_to_send() == bytes([5, 0, 0, 1, 10, 77, 0, 5]) + (40000).to_bytes(2, "big")
    assert conn.state == "relay"


def test_bytes_sent_ahead_of_the_reply_are_the_start_of_the_data_phase():
    conn = core.Socks5Connection()
    events, _ = feed(conn, NO_AUTH_GREETING + request("10.0.0.1", 80) + b"GET / HTTP/1.1\r\n")
    assert events and conn.trailing_data == b"GET / HTTP/1.1\r\n"


def test_a_greeting_with_many_methods_picks_no_auth():
    conn = core.Socks5Connection()
    _, out = feed(conn, bytes([5, 3, 1, 2, 0]))
    assert out == bytes([5, 0]) and conn.state == "request"


def test_username_and_password_accepted():
    conn = core.Socks5Connection(AUTH)
    events, out = feed(conn, USERPASS_GREETING + userpass(b"alice", b"s3cret") + request("10.0.0.1", 443))
    assert out == bytes([5, 2]) + bytes([1, 0])  # method 02, then RFC 1929 status 00
    assert events == [core.ConnectRequest("10.0.0.1", 443, AddressType.IPV4)]


@pytest.mark.parametrize("user, password", [(b"alice", b"wrong"), (b"bob", b"s3cret"), (b"", b""), (b"alice", b"")])
def test_wrong_credentials_get_status_failure_and_close(user, password):
    conn = core.Socks5Connection(AUTH)
    events, out = feed(conn, USERPASS_GREETING + userpass(user, password) + request("10.0.0.1", 443))
    assert out == bytes([5, 2, 1, 1])  # RFC 1929 §2: non-zero STATUS, then the server closes
    assert events == [core.Refused("wrong username or password")]
    assert conn.state == "closed" and conn.request is None


def test_client_without_userpass_is_told_no_method_is_acceptable():
    conn = core.Socks5Connection(AUTH)
    events, out = feed(conn, NO_AUTH_GREETING)
    assert out == bytes([5, 0xFF])
    assert "offered 0" in events[0].reason and "username/password" in events[0].reason


def test_client_offering_only_userpass_to_a_proxy_without_credentials():
    conn = core.Socks5Connection()
    events, out = feed(conn, bytes([5, 1, 2]))
    assert out == bytes([5, 0xFF]) and "no authentication" in events[0].reason


def test_a_greeting_with_no_methods():
    events, out = feed(core.Socks5Connection(), bytes([5, 0]))
    assert out == bytes([5, 0xFF]) and "offered none" in events[0].reason


@pytest.mark.parametrize("command, name", [(2, "BIND"), (9, "command 9")])
def test_commands_other_than_connect_and_udp_associate_are_not_supported(command, name):
    conn = core.Socks5Connection()
    events, out = feed(conn, NO_AUTH_GREETING + request("10.0.0.1", 53, command=command))
    assert out[2:] == core.encode_reply(Reply.COMMAND_NOT_SUPPORTED)
    assert out[3] == 0x07
    assert events == [core.Refused(f"{name} is not supported (only CONNECT and UDP ASSOCIATE)")]
    assert conn.state == "closed"


@pytest.mark.parametrize("host, port, atyp", [
    ("0.0.0.0", 0, AddressType.IPV4),  # "not known yet": what most clients send
    ("127.0.0.1", 40000, AddressType.IPV4),
    ("::", 0, AddressType.IPV6),
    ("client.example", 5353, AddressType.DOMAIN),
])
def test_udp_associate_is_a_request_with_the_clients_source_and_port_0_is_allowed(host, port, atyp):
    conn = core.Socks5Connection(AUTH)
    events, out = feed(conn, USERPASS_GREETING + userpass(b"alice", b"s3cret") + request(host, port, command=3),
                       one_byte_at_a_time=True)
    assert out == bytes([5, 2, 1, 0])  # nothing answered yet: the driver opens the relay first
    assert events == [core.AssociateRequest(host, port, atyp)] and conn.request == events[0]
    assert conn.state == "dialling"
    conn.reply(Reply.SUCCEEDED, ("127.0.0.1", 40123))
    assert conn.data_to_send() == bytes([5, 0, 0, 1, 127, 0, 0, 1]) + (40123).to_bytes(2, "big")
    assert conn.state == "relay"


def test_udp_associate_without_the_credentials_is_refused_before_the_request():
    conn = core.Socks5Connection(AUTH)
    events, out = feed(conn, USERPASS_GREETING + userpass(b"alice", b"wrong") + request("0.0.0.0", 0, command=3))
    assert out == bytes([5, 2, 1, 1])
    assert events == [core.Refused("wrong username or password")] and conn.request is None


def test_udp_associate_a_driver_cannot_serve_is_answered_07_and_closes():
    conn = core.Socks5Connection()
    feed(conn, NO_AUTH_GREETING + request("0.0.0.0", 0, command=3))
    conn.data_to_send()
    conn.reply(Reply.COMMAND_NOT_SUPPORTED)
    assert conn.data_to_send() == core.encode_reply(Reply.COMMAND_NOT_SUPPORTED)
    assert conn.state == "closed"


def test_unknown_address_type_is_not_supported():
    conn = core.Socks5Connection()
    events, out = feed(conn, NO_AUTH_GREETING + bytes([5, 1, 0, 2, 1, 2, 3, 4, 0, 80]))
    assert out[2:] == core.encode_reply(Reply.ADDRESS_TYPE_NOT_SUPPORTED) and out[3] == 0x08
    assert "address type 2" in events[0].reason


@pytest.mark.parametrize("code", list(Reply))
def test_every_reply_code_is_encoded(code):
    conn = core.Socks5Connection()
    feed(conn, NO_AUTH_GREETING + request("10.0.0.1", 80))
    conn.reply(code)
    assert conn.data_to_send() == bytes([5, code, 0, 1, 0, 0, 0, 0, 0, 0])  # BND 0.0.0.0:0
    assert conn.state == ("relay" if code is Reply.SUCCEEDED else "closed")


def test_reply_bound_to_an_ipv6_address():
    assert core.encode_reply(Reply.SUCCEEDED, ("fd00::5", 443)) == (
        bytes([5, 0, 0, 4]) + ipaddress.IPv6Address("fd00::5").packed + (443).to_bytes(2, "big"))
    assert core.encode_reply(Reply.SUCCEEDED, ("::ffff:10.0.0.2", 1))[3] == 1  # IPv4-mapped: as IPv4


def test_reply_only_once_and_only_after_a_request():
    conn = core.Socks5Connection()
    with pytest.raises(RuntimeError):
        conn.reply(Reply.SUCCEEDED)
    feed(conn, NO_AUTH_GREETING + request("10.0.0.1", 80))
    conn.reply(Reply.HOST_UNREACHABLE)
    with pytest.raises(RuntimeError):
        conn.reply(Reply.SUCCEEDED)


@pytest.mark.parametrize(
    "err, code",
    [
        (ResolveError("nosuch", 80, "name does not resolve"), Reply.HOST_UNREACHABLE),
        (DialTimeout("10.0.0.1", 80, "no answer"), Reply.HOST_UNREACHABLE),
        (DialRefused("10.0.0.1", 80, "connection refused"), Reply.CONNECTION_REFUSED),
        (DialUnreachable("10.0.0.1", 80, "no route"), Reply.NETWORK_UNREACHABLE),
        (DialError("10.0.0.1", 80, "other"), Reply.GENERAL_FAILURE),
    ],
)
def test_reply_for_a_failed_dial(err, code):
    assert core.reply_for(err) is code


# ---------------------------------------------------------------- malformed input, named


@pytest.mark.parametrize(
    "auth, data, named, answer",
    [
        (None, bytes([4, 1, 0, 80, 10, 0, 0, 1, 0]), "version 4 in the greeting", b""),  # a SOCKS4 client
        (AUTH, USERPASS_GREETING + userpass(b"alice", b"s3cret", version=5),
         "version 5 in the username/password request", bytes([1, 1])),
        (None, NO_AUTH_GREETING + bytes([4, 1, 0, 1, 10, 0, 0, 1, 0, 80]), "version 4 in the request",
         core.encode_reply(Reply.GENERAL_FAILURE)),
        (None, NO_AUTH_GREETING + bytes([5, 1, 0, 3, 0, 0, 80]), "domain name of length 0",
         core.encode_reply(Reply.GENERAL_FAILURE)),
        (None, NO_AUTH_GREETING + request("bad host!", 80), "domain name 'bad host!'",
         core.encode_reply(Reply.HOST_UNREACHABLE)),
        (None, NO_AUTH_GREETING + bytes([5, 1, 0, 3, 2, 0xC3, 0xA9, 0, 80]), "is not a host name",
         core.encode_reply(Reply.HOST_UNREACHABLE)),
        (None, NO_AUTH_GREETING + request("10.0.0.1", 0), "destination port 0",
         core.encode_reply(Reply.GENERAL_FAILURE)),
    ],
)
def test_malformed_input_names_the_field_and_queues_the_allowed_answer(auth, data, named, answer):
    conn = core.Socks5Connection(auth)
    with pytest.raises(core.Socks5ProtocolError) as caught:
        feed(conn, data)
    assert named in caught.value.reason
    sent = conn.data_to_send()
    assert sent.endswith(answer) and conn.state == "closed"


@settings(deadline=None)  # a busy machine must not fail it on time
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_crash_the_core(data):
    for auth in (None, AUTH):
        conn = core.Socks5Connection(auth)
        try:
            feed(conn, data)
        except core.Socks5ProtocolError as err:
            assert err.reason


# ---------------------------------------------------------------- credentials setting


def test_auth_parse_and_repr_hides_the_password():
    auth = core.SocksAuth.parse("alice:pa:ss\n")
    assert (auth.username, auth.password) == ("alice", "pa:ss")
    assert "pa:ss" not in repr(auth)
    assert auth.check(b"alice", b"pa:ss") and not auth.check(b"alice", b"pa")


@pytest.mark.parametrize("value", ["alice", ":pw", "alice:", "a" * 256 + ":pw", "alice:" + "p" * 256])
def test_auth_parse_errors_name_the_source(value):
    with pytest.raises(ConfigError) as caught:
        core.SocksAuth.parse(value, source="--socks-auth-file")
    assert caught.value.source == "--socks-auth-file"
    assert "USER:PASSWORD" in str(caught.value)
