"""The proxy's pure core: targets, hop-by-hop headers, auth, listen address, error bodies."""

from __future__ import annotations

import ast
import base64
import inspect

import pytest
from hypothesis import given
from hypothesis import strategies as st

from anex_agent.errors import BadRequest, ConfigError
from anex_agent.frontends import proxy_core as core
from anex_agent.frontends import this_host


def test_core_does_no_io():
    tree = ast.parse(inspect.getsource(core))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & {"asyncio", "socket", "time", "h11"}


@pytest.mark.parametrize(
    "method, target, expected",
    [
        (b"GET", b"http://example.com/a?b=1", core.Destination("example.com", 80, b"/a?b=1", b"example.com")),
        (b"POST", b"http://web.default.svc.cluster.local:8080", core.Destination("web.default.svc.cluster.local", 8080, b"/", b"web.default.svc.cluster.local:8080")),
        (b"DELETE", b"HTTP://10.0.0.1:81/x", core.Destination("10.0.0.1", 81, b"/x", b"10.0.0.1:81")),
        (b"GET", b"http://[fd00::1]:8080/", core.Destination("fd00::1", 8080, b"/", b"[fd00::1]:8080")),
        (b"CONNECT", b"example.com:443", core.Destination("example.com", 443, b"", b"example.com:443")),
        (b"CONNECT", b"[fd00::1]:22", core.Destination("fd00::1", 22, b"", b"[fd00::1]:22")),
    ],
)
def test_parse_target(method, target, expected):
    assert core.parse_target(method, target) == expected


@pytest.mark.parametrize(
    "method, target, words",
    [
        (b"GET", b"/index.html", "absolute URL"),
        (b"OPTIONS", b"*", "absolute URL"),
        (b"GET", b"https://example.com/", "CONNECT"),
        (b"GET", b"ftp://example.com/", "unsupported scheme"),
        (b"GET", b"http://user:pw@example.com/", "user information"),
        (b"GET", b"http://example.com:99999/", "bad port"),
        (b"GET", b"http://fd00::1/", "brackets"),
        (b"CONNECT", b"example.com", "no port"),
        (b"CONNECT", b":443", "no host"),
        (b"GET", "http://ex\u00e4mple.com/".encode(), "not ASCII"),
    ],
)
def test_parse_target_rejects_with_a_reason(method, target, words):
    with pytest.raises(BadRequest) as info:
        core.parse_target(method, target)
    assert words in info.value.reason


def test_hop_by_hop_fields_and_those_named_in_connection_are_removed():
    headers = [
        (b"Host", b"ignored"),
        (b"Connection", b"keep-alive, X-Secret"),
        (b"Proxy-Connection", b"keep-alive"),
        (b"Keep-Alive", b"timeout=5"),
        (b"Proxy-Authorization", b"Basic Zm9vOmJhcg=="),
        (b"TE", b"trailers"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Upgrade", b"websocket"),
        (b"X-Secret", b"hop"),
        (b"Expect", b"100-continue"),
        (b"X-Keep", b"1"),
        (b"Content-Type", b"text/plain"),
    ]
    dest = core.parse_target(b"POST", b"http://origin:8080/p")
    out = core.request_headers(headers, dest, chunked=True)
    assert out == [
        (b"Host", b"origin:8080"),
        (b"X-Keep", b"1"),
        (b"Content-Type", b"text/plain"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Via", core.VIA),
    ]


def test_response_headers_keep_end_to_end_fields_and_add_via():
    out = core.response_headers([(b"Content-Length", b"3"), (b"Connection", b"close"), (b"Set-Cookie", b"a=b")])
    assert out == [(b"Content-Length", b"3"), (b"Set-Cookie", b"a=b"), (b"Via", core.VIA)]


def test_a_response_with_both_framings_loses_its_content_length():
    # RFC 9112 §6.3: read chunked, so the Content-Length must not reach the client
    out = core.response_headers([(b"Content-Length", b"100"), (b"Transfer-Encoding", b"chunked"), (b"X-A", b"1")])
    assert out == [(b"X-A", b"1"), (b"Via", b"1.1 anex-agent")]


@pytest.mark.parametrize(
    "headers, refused",
    [
        ([(b"Content-Length", b"5"), (b"Transfer-Encoding", b"chunked")], True),
        ([(b"transfer-encoding", b"chunked"), (b"CONTENT-LENGTH", b"0")], True),
        ([(b"Content-Length", b"5")], False),
        ([(b"Transfer-Encoding", b"chunked")], False),
        ([(b"X-Content-Length", b"5"), (b"Transfer-Encoding", b"chunked")], False),
    ],
)
def test_framing_error_refuses_content_length_with_transfer_encoding(headers, refused):
    reason = core.framing_error(headers)
    assert (reason is not None) is refused
    if refused:
        assert "Content-Length" in reason and "Transfer-Encoding" in reason and "RFC 9112" in reason


def test_forbidden_text_names_the_destination():
    assert core.forbidden_text("::1", 9555).startswith("[::1]:9555 is this machine")
    assert "only local clients" in core.forbidden_text("127.1", 80)


def test_body_detection():
    assert core.has_body([(b"content-length", b"5")])
    assert core.has_body([(b"transfer-encoding", b"chunked")])
    assert not core.has_body([(b"content-length", b"0")])
    assert not core.has_body([(b"host", b"x")])
    assert core.is_chunked([(b"Transfer-Encoding", b"gzip, chunked")])


def _basic(user: str, password: str) -> bytes:
    return b"Basic " + base64.b64encode(f"{user}:{password}".encode())


def test_proxy_auth_accepts_only_the_right_basic_credentials():
    auth = core.ProxyAuth("alice", "s3cret")
    assert auth.check([(b"Proxy-Authorization", _basic("alice", "s3cret"))])
    assert not auth.check([(b"Proxy-Authorization", _basic("alice", "wrong"))])
    assert not auth.check([(b"Proxy-Authorization", b"Bearer abc")])
    assert not auth.check([(b"Proxy-Authorization", b"Basic !!!notbase64")])
    assert not auth.check([(b"Authorization", _basic("alice", "s3cret"))])  # origin auth is not proxy auth
    assert not auth.check([])
    assert auth.challenge()[0][0] == b"Proxy-Authenticate"
    assert b'Basic realm="anex-agent"' in auth.challenge()[0][1]


@given(st.text(min_size=1).filter(lambda s: ":" not in s), st.text())
def test_proxy_auth_roundtrip(user, password):
    auth = core.ProxyAuth.parse(f"{user}:{password}")
    assert auth.check([(b"proxy-authorization", _basic(user, password))])


def test_proxy_auth_parse_errors_name_the_input():
    with pytest.raises(ConfigError) as info:
        core.ProxyAuth.parse("nocolon")
    assert "ANEX_PROXY_AUTH" in str(info.value) and "USER:PASSWORD" in str(info.value)


def test_error_response_is_plain_text_and_closes():
    status, reason, headers, body = core.error_response(
        502, core.unreachable_text("web.default.svc.cluster.local", 80, "connection refused")
    )
    assert (status, reason) == (502, b"Bad Gateway")
    assert body == b"anex-agent proxy: cannot reach web.default.svc.cluster.local:80: connection refused\n"
    assert (b"Connection", b"close") in headers
    assert (b"Content-Length", str(len(body)).encode()) in headers
    assert core.unreachable_text("fd00::1", 80, "x") == "cannot reach [fd00::1]:80: x"


@pytest.mark.parametrize(
    "client, destination, allowed",
    [("127.0.0.1", "127.0.0.1", True), ("::1", "127.0.0.5", True), ("127.0.0.1", "10.96.0.10", True),
     ("10.254.0.9", "10.96.0.10", True), ("10.254.0.9", "127.0.0.1", False), ("192.0.2.1", "::1", False)],
)
def test_only_local_clients_may_reach_loopback_destinations(client, destination, allowed):
    assert this_host.may_reach(client, destination) is allowed
