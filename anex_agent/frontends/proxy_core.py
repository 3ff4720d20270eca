"""Pure request handling of the HTTP proxy: targets, headers, auth, error responses.

No I/O here (no asyncio, socket or time): :mod:`anex_agent.frontends.proxy` drives
h11 connections and calls these functions. Everything takes and returns bytes and
plain values, so it is tested without a network.

Specs: RFC 9110 (HTTP semantics) and RFC 9112 (HTTP/1.1).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import urlsplit

from anex_agent import parse
from anex_agent.errors import BadRequest, ConfigError

Headers = list[tuple[bytes, bytes]]

DEFAULT_LISTEN = ("127.0.0.1", 3128)
VIA = b"1.1 anex-agent"  # RFC 9110 §7.6.3: a proxy MUST add Via

# RFC 9110 §7.6.1: connection-specific fields a proxy must not forward, plus every
# field named in Connection. Proxy-Connection is the pre-standard spelling clients
# still send; Proxy-Authorization is consumed by this proxy (RFC 9110 §11.7.2).
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"proxy-connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)


@dataclass(frozen=True)
class Destination:
    """Where a request goes: ``host`` (name or IP, IPv6 without brackets), ``port``,
    and for absolute-form requests the origin-form ``path`` (path + query) and the
    ``authority`` to put in ``Host``."""

    host: str
    port: int
    path: bytes = b""
    authority: bytes = b""

    @property
    def key(self) -> tuple[str, int]:
        return (self.host.lower(), self.port)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _split_authority(authority: str, default_port: int | None) -> tuple[str, int]:
    if not authority or "@" in authority:
        raise BadRequest("the target must be HOST:PORT (no user information)")
    if authority.startswith("["):
        host, sep, rest = authority[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise BadRequest(f"bad IPv6 authority {authority!r}")
        port_text = rest[1:] if rest else ""
    else:
        if authority.count(":") > 1:
            raise BadRequest(f"bad authority {authority!r} (IPv6 addresses go in brackets)")
        host, _, port_text = authority.partition(":")
    if not host:
        raise BadRequest(f"no host in {authority!r}")
    if port_text == "":
        if default_port is None:
            raise BadRequest(f"{authority!r} has no port; CONNECT needs HOST:PORT")
        return host, default_port
    try:
        return host, parse.port(port_text)
    except ValueError:
        raise BadRequest(f"bad port in {authority!r} (1-65535)") from None


def parse_target(method: bytes, target: bytes) -> Destination:
    """Destination of a proxy request (RFC 9112 §3.2.2 absolute-form, §3.2.3 authority-form).

    ``CONNECT host:port``; every other method needs ``http://host[:port]/path``.
    Raises :class:`BadRequest` with a text for the 400 body.
    """
    try:
        text = target.decode("ascii")
    except UnicodeDecodeError:
        raise BadRequest("the request target is not ASCII") from None
    if method == b"CONNECT":
        host, port = _split_authority(text, None)
        return Destination(host, port, authority=text.encode())
    if text.startswith("/") or text == "*":
        raise BadRequest(
            "this is a forward proxy: send the absolute URL (GET http://host/path) or use CONNECT host:port"
        )
    try:
        url = urlsplit(text)
    except ValueError:
        raise BadRequest(f"cannot parse the request target {text!r}") from None
    if url.scheme.lower() != "http":
        if url.scheme.lower() == "https":
            raise BadRequest("https:// URLs go through CONNECT (the proxy does not terminate TLS)")
        raise BadRequest(f"unsupported scheme {url.scheme!r}: only http:// (and CONNECT for anything else)")
    host, port = _split_authority(url.netloc, 80)
    path = url.path or "/"
    if url.query:
        path += "?" + url.query
    return Destination(host, port, path=path.encode(), authority=url.netloc.encode())


def _connection_tokens(headers: Iterable[tuple[bytes, bytes]]) -> set[bytes]:
    tokens: set[bytes] = set()
    for name, value in headers:
        if name.lower() in (b"connection", b"proxy-connection"):
            tokens.update(t.strip().lower() for t in value.split(b",") if t.strip())
    return tokens


def end_to_end(headers: Iterable[tuple[bytes, bytes]]) -> Headers:
    """``headers`` without hop-by-hop fields (RFC 9110 §7.6.1), original order and case."""
    items = list(headers)
    drop = HOP_BY_HOP | _connection_tokens(items)
    return [(n, v) for n, v in items if n.lower() not in drop]


def _with_via(headers: Headers) -> Headers:
    return headers + [(b"Via", VIA)]


def request_headers(headers: Iterable[tuple[bytes, bytes]], dest: Destination, *, chunked: bool) -> Headers:
    """Headers to send to the origin for an absolute-form request.

    ``Host`` is replaced by the target's authority (RFC 9112 §3.2.2), ``Expect`` is
    dropped (the proxy answers ``100 Continue`` itself, RFC 9110 §10.1.1), and a
    chunked request body stays chunked (Transfer-Encoding is hop-by-hop, so it is
    re-added for the next hop).
    """
    out = [(n, v) for n, v in end_to_end(headers) if n.lower() not in (b"host", b"expect")]
    out.insert(0, (b"Host", dest.authority))
    if chunked:
        out.append((b"Transfer-Encoding", b"chunked"))
    return _with_via(out)


def response_headers(headers: Iterable[tuple[bytes, bytes]]) -> Headers:
    """Headers to send back to the client: end-to-end fields of the origin's response, plus Via.

    Framing is left to h11 on the client side (chunked for HTTP/1.1 when there is no
    Content-Length; close-delimited for HTTP/1.0). A response that came with both
    Transfer-Encoding and Content-Length was read chunked, so its Content-Length is
    dropped: RFC 9112 §6.3 ("an intermediary that chooses to forward the message MUST
    first remove the received Content-Length field").
    """
    items = list(headers)
    if any(name.lower() == b"transfer-encoding" for name, _ in items):
        items = [(n, v) for n, v in items if n.lower() != b"content-length"]
    return _with_via(end_to_end(items))


def framing_error(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """Why a request's body framing is ambiguous (the text of a 400), or None when it is not.

    RFC 9112 §6.3: a message with both Transfer-Encoding and Content-Length "might indicate
    an attempt to perform request smuggling"; a server MAY reject it and MUST close the
    connection afterwards. A proxy that forwarded it would let the client and the origin
    disagree on where the body ends, so it is refused. (Conflicting Content-Length values
    and unknown transfer codings are refused earlier, by h11.)
    """
    names = {name.lower() for name, _ in headers}
    if b"transfer-encoding" in names and b"content-length" in names:
        return "a request must not carry both Content-Length and Transfer-Encoding (RFC 9112 §6.3)"
    return None


def is_chunked(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        if name.lower() == b"transfer-encoding" and value.strip().lower().endswith(b"chunked"):
            return True
    return False


# RFC 9110 §9.2.2: the idempotent methods. "A proxy MUST NOT automatically retry
# non-idempotent requests" (a POST on a stale reused connection gets a 502 instead).
IDEMPOTENT_METHODS = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"})


def may_retry(method: bytes, with_body: bool) -> bool:
    """Whether a request that failed on a stale reused connection may be sent again on a fresh
    one: idempotent (RFC 9110 §9.2.2) and without a body (the body was consumed)."""
    return method.upper() in IDEMPOTENT_METHODS and not with_body


def has_body(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether a request carries a body (RFC 9112 §6.3: Transfer-Encoding or Content-Length > 0)."""
    for name, value in headers:
        lname = name.lower()
        if lname == b"transfer-encoding":
            return True
        if lname == b"content-length" and value.strip() not in (b"0", b""):
            return True
    return False


@dataclass(frozen=True)
class ProxyAuth:
    """Basic credentials the proxy requires in ``Proxy-Authorization`` (RFC 9110 §11.7.2, RFC 7617)."""

    username: str
    password: str = field(repr=False)  # secret
    realm: str = "anex-agent"

    @classmethod
    def parse(cls, value: str, *, source: str = "ANEX_PROXY_AUTH") -> ProxyAuth:
        """``user:password`` -> ProxyAuth; ConfigError when there is no colon or no user."""
        user, sep, password = value.partition(":")
        if not sep or not user:
            raise ConfigError(source, "expected USER:PASSWORD (the user must not be empty)")
        return cls(user, password)

    def challenge(self) -> Headers:
        return [(b"Proxy-Authenticate", f'Basic realm="{self.realm}", charset="UTF-8"'.encode())]

    def check(self, headers: Iterable[tuple[bytes, bytes]]) -> bool:
        """True when some Proxy-Authorization field carries these Basic credentials."""
        expected = f"{self.username}:{self.password}".encode()
        ok = False
        for name, value in headers:
            if name.lower() != b"proxy-authorization":
                continue
            scheme, _, token = value.strip().partition(b" ")
            if scheme.lower() != b"basic":
                continue
            try:
                given = base64.b64decode(token.strip(), validate=True)
            except (binascii.Error, ValueError):
                continue
            ok |= hmac.compare_digest(given, expected)
        return ok


def error_response(status: int, text: str) -> tuple[int, bytes, Headers, bytes]:
    """(status, reason, headers, body) of a proxy-generated error: plain text, connection closed after."""
    body = f"anex-agent proxy: {text}\n".encode("utf-8", "replace")
    headers = [
        (b"Content-Type", b"text/plain; charset=utf-8"),
        (b"Content-Length", str(len(body)).encode()),
        (b"Connection", b"close"),
        (b"Via", VIA),
    ]
    try:
        reason = HTTPStatus(status).phrase.encode()
    except ValueError:
        reason = b""
    return status, reason, headers, body


def forbidden_text(host: str, port: int) -> str:
    """Body of the 403 for a client from beyond loopback asking for this machine."""
    shown = f"[{host}]" if ":" in host else host
    return (
        f"{shown}:{port} is this machine (its loopback); "
        "only local clients may reach it through the proxy"
    )


def unreachable_text(host: str, port: int, reason: str) -> str:
    """Body of a 502: names the destination and why it failed."""
    shown = f"[{host}]" if ":" in host else host
    return f"cannot reach {shown}:{port}: {reason}"
