"""Parsing of small textual values, once for the whole product: integers, ports, HOST:PORT, CIDRs, booleans.

Which function for which value:

* :func:`port` -- a port number alone (``GW_TUNNEL_<port>``).
* :func:`port_protocol` -- a port and its transport protocol: ``PORT`` (TCP), ``PORT/tcp`` or
  ``PORT/udp`` (the items of ``ANEX_INBOUND_PORTS``).
* :func:`host_port` -- where to connect: a host name or IP address and a port (tunnel
  targets, WireGuard endpoints, wireproxy targets).
* :func:`ip_port` -- an IP address and a port, no names (DNS servers, UAPI endpoints);
  with ``default_port`` the port may be left out.
* :func:`listen` -- where to listen: an IP address or ``localhost`` and a port; port 0
  ("any free port") only where the caller says so.
* :func:`cidr` -- a network.
* :func:`number` -- a decimal amount (seconds, counts) with a lower bound.
* :func:`boolean` -- on or off: every boolean variable, flag value and query parameter
  (``ANEX_ALLOW_INSECURE``, ``ANEX_LOGS``, ``ANEX_PROXY_ENV``,
  ``ANEX_METRICS_PCIE_THROUGHPUT``, the agent API's ``follow`` / ``timestamps``).
* :func:`duration` -- a whole number of seconds written with an optional unit (``90``,
  ``90s``, ``15m``, ``12h``, ``7d``), within bounds.

Every form writes an IPv6 address in brackets when a port follows it (``[fd00::1]:53``).

Contract: every function takes the text as received and either returns the parsed value
or raises :class:`ValueError` whose message says what is accepted (``"must be ..."``),
without naming the input: the caller knows whether it is a query parameter, a JSON
field, a command-line option or an environment variable, and names it (the wire
models put the field in the 422 problem; the coordinator's registry names the query
parameter; flags and variables go through :func:`anex_agent.errors.config_value`, which
raises ``ConfigError("--listen", "'127.0.0.1:²' must be ...")``: exit status 2, one line;
argparse-only tools use :func:`arg_type`).

Digits are ASCII digits only. ``str.isdigit`` and ``int()`` also accept other scripts'
digits (``"٣"``, ``"３"``) and ``isdigit`` even superscripts (``"²"``) that ``int()``
then refuses; a value read here is the value a person typing ASCII meant. Lengths are
bounded before any conversion, so a 5,000-digit number costs nothing.

The module imports nothing of anex-agent and no I/O: roles and cores may use it alike.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable

MAX_INT_DIGITS = 19  # enough for any signed 64-bit value; longer input is refused before int()

PORT_MIN, PORT_MAX = 1, 65535

# RFC 1123 host names (labels of letters, digits, hyphens; underscores tolerated, as DNS
# service names use them), 253 characters at most.
HOSTNAME_MAX = 253
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOSTNAME_RE = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")
_DIGITS_RE = re.compile(r"[0-9]+")
_DECIMAL_RE = re.compile(r"[0-9]+(?:\.[0-9]+)?|\.[0-9]+")

# HOST:PORT as a JSON schema / OpenAPI pattern (the exact check is :func:`host_port`).
HOST_PORT_PATTERN = r"^(\[[0-9A-Fa-f:.]+(%[A-Za-z0-9_.-]+)?\]|[A-Za-z0-9_.-]+):[0-9]{1,5}$"
HOST_PORT_MAX = HOSTNAME_MAX + len(":65535")
CIDR_MAX = 49  # the longest IPv6 network text (45) + "/128"


def integer(text: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """ASCII decimal digits (no sign, no spaces, no underscores) as an int within the bounds."""
    if not isinstance(text, str) or len(text) > MAX_INT_DIGITS or not _DIGITS_RE.fullmatch(text):
        raise ValueError(_range_text(minimum, maximum))
    value = int(text)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(_range_text(minimum, maximum))
    return value


#: The words :func:`boolean` accepts, either case, surrounding spaces ignored.
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
BOOLEAN_ACCEPTED = "1/0, true/false, yes/no or on/off (any case)"


def boolean(text: str) -> bool:
    """``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``, any case, surrounding
    spaces ignored. (Unset or empty is the caller's default:
    :func:`anex_agent.errors.env_value`.)"""
    word = text.strip().lower() if isinstance(text, str) and len(text) <= 16 else None
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(f"must be one of {BOOLEAN_ACCEPTED}")


def number(text: str, *, minimum: float, integer: bool = False) -> float:
    """A decimal number in ASCII digits (``12``, ``0.5``, ``.5``; no sign, exponent, ``nan`` or
    ``inf``) of at least ``minimum``; with ``integer``, digits only and an int is returned."""
    kind = "an integer" if integer else "a number"
    if (not isinstance(text, str) or len(text) > MAX_INT_DIGITS * 2
            or not (_DIGITS_RE if integer else _DECIMAL_RE).fullmatch(text)):
        raise ValueError(f"must be {kind} of at least {minimum:g}, in ASCII digits")
    value = int(text) if integer else float(text)
    if value < minimum:
        raise ValueError(f"must be {kind} of at least {minimum:g}, in ASCII digits")
    return value


_DURATION_RE = re.compile(r"([0-9]+)([smhd]?)")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str, *, minimum: int = 1, maximum: int | None = None) -> int:
    """Seconds from ``N``, ``Ns``, ``Nm``, ``Nh`` or ``Nd`` (ASCII digits, one unit), within the bounds."""
    accepted = ("must be a duration such as 90, 90s, 15m, 12h or 7d" +
                (f", from {minimum} s to {maximum} s" if maximum is not None else f", at least {minimum} s"))
    match = _DURATION_RE.fullmatch(text) if isinstance(text, str) and len(text) <= MAX_INT_DIGITS else None
    if match is None:
        raise ValueError(accepted)
    value = int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if value < minimum or (maximum is not None and value > maximum):
        raise ValueError(accepted)
    return value


def is_integer(text: object) -> bool:
    """Whether ``text`` is what :func:`integer` reads without bounds: ASCII decimal digits only."""
    return isinstance(text, str) and len(text) <= MAX_INT_DIGITS and _DIGITS_RE.fullmatch(text) is not None


def _range_text(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f"must be an integer from {minimum} to {maximum}, in ASCII digits"
    if minimum is not None:
        return f"must be an integer of at least {minimum}, in ASCII digits"
    return "must be a non-negative integer in ASCII digits"


def port(text: str) -> int:
    """A TCP/UDP port, 1..65535, in ASCII digits."""
    try:
        return integer(text, minimum=PORT_MIN, maximum=PORT_MAX)
    except ValueError:
        raise ValueError(f"must be a port from {PORT_MIN} to {PORT_MAX}, in ASCII digits") from None


PROTOCOLS = ("tcp", "udp")
_PORT_PROTOCOL_TEXT = f"must be PORT, PORT/tcp or PORT/udp with a port from {PORT_MIN} to {PORT_MAX}, in ASCII digits"


def port_protocol(text: str) -> tuple[int, str]:
    """``PORT`` (TCP), ``PORT/tcp`` or ``PORT/udp`` -> ``(port, "tcp" | "udp")``; the protocol in
    any case (Kubernetes writes ``UDP``)."""
    if not isinstance(text, str) or len(text) > len("65535/") + 3:
        raise ValueError(_PORT_PROTOCOL_TEXT)
    number, sep, protocol = text.partition("/")
    protocol = protocol.lower() if sep else "tcp"
    if protocol not in PROTOCOLS:
        raise ValueError(_PORT_PROTOCOL_TEXT)
    try:
        return port(number), protocol
    except ValueError:
        raise ValueError(_PORT_PROTOCOL_TEXT) from None


def host(text: str) -> str:
    """A host name, an IPv4 address or an IPv6 address (bare here; brackets belong to HOST:PORT)."""
    if not isinstance(text, str) or not text or len(text) > HOSTNAME_MAX or not text.isascii():
        raise ValueError(f"must be a host name (at most {HOSTNAME_MAX} characters) or an IP address")
    try:
        ipaddress.ip_address(text)
        return text
    except ValueError:
        pass
    if _HOSTNAME_RE.fullmatch(text):
        return text
    raise ValueError(f"must be a host name (letters, digits, '-', '.', at most {HOSTNAME_MAX} characters) "
                     "or an IP address")


_HOST_PORT_TEXT = "must be HOST:PORT with a port from 1 to 65535, in ASCII digits (IPv6 hosts in brackets: [::1]:80)"


def host_port(text: str) -> tuple[str, int]:
    """``HOST:PORT`` -> ``(host, port)``; an IPv6 host is written in brackets and returned without."""
    if not isinstance(text, str) or len(text) > HOST_PORT_MAX:
        raise ValueError(_HOST_PORT_TEXT)
    name, sep, port_text = text.rpartition(":")
    if not sep or not name:
        raise ValueError(_HOST_PORT_TEXT)
    if name.startswith("[") and name.endswith("]"):
        inner = name[1:-1]
        try:
            if not inner.isascii() or not isinstance(ipaddress.ip_address(inner), ipaddress.IPv6Address):
                raise ValueError
        except ValueError:
            raise ValueError(_HOST_PORT_TEXT) from None
        name = inner
    elif ":" in name:  # an IPv6 address without brackets: ambiguous with the port
        raise ValueError(_HOST_PORT_TEXT)
    else:
        try:
            host(name)
        except ValueError:
            raise ValueError(_HOST_PORT_TEXT) from None
    try:
        return name, port(port_text)
    except ValueError:
        raise ValueError(_HOST_PORT_TEXT) from None


def _ip_host(name: str, accepted: str) -> str:
    """The IP address written as the HOST of ``HOST:PORT``: IPv4 bare, IPv6 in brackets (returned
    without them). Anything else raises ValueError(``accepted``)."""
    bracketed = name.startswith("[") and name.endswith("]")
    inner = name[1:-1] if bracketed else name
    try:
        address = ipaddress.ip_address(inner)
    except ValueError:
        raise ValueError(accepted) from None
    if (address.version == 6) != bracketed:  # IPv6 needs brackets, IPv4 has none
        raise ValueError(accepted)
    return inner


_IP_PORT_TEXT = ("must be an IP address and a port from 1 to 65535, in ASCII digits "
                 "(IPv6 in brackets: [fd00::a]:53)")
_IP_PORT_OPTIONAL_TEXT = ("must be an IP address, optionally with a port from 1 to 65535 in ASCII digits "
                          "(IP, IP:PORT, IPv6 or [IPv6]:PORT, for example 10.96.0.10:53)")


def ip_port(text: str, *, default_port: int | None = None) -> tuple[str, int]:
    """``IP:PORT`` / ``[IPv6]:PORT`` -> ``(ip, port)``; no host names.

    With ``default_port``, a bare IP address (IPv4, or IPv6 without brackets) is accepted
    too and stands for that port.
    """
    accepted = _IP_PORT_TEXT if default_port is None else _IP_PORT_OPTIONAL_TEXT
    if not isinstance(text, str) or len(text) > HOST_PORT_MAX or not text.isascii():
        raise ValueError(accepted)
    if default_port is not None and not text.startswith("["):
        try:
            ipaddress.ip_address(text)
            return text, default_port
        except ValueError:
            pass
    name, sep, port_text = text.rpartition(":")
    inner = _ip_host(name, accepted)
    if not sep:
        raise ValueError(accepted)
    try:
        return inner, port(port_text)
    except ValueError:
        raise ValueError(accepted) from None


LOCALHOST = "127.0.0.1"  # what ``localhost`` means in a listen address


def listen(text: str, *, empty_host: str | None = None, any_port: bool = False) -> tuple[str, int]:
    """An address to listen on: ``IP:PORT``, ``[IPv6]:PORT`` or ``localhost:PORT`` -> ``(ip, port)``.

    ``localhost`` is read as 127.0.0.1, so what is bound is what the log says.
    ``:PORT`` is accepted only with ``empty_host``, returned in place of the missing host
    (``"127.0.0.1"``: loopback; ``""``: every address). Port 0 ("any free port: the
    system picks one") only with ``any_port``, for a listener that tells its bound port.
    """
    low = 0 if any_port else PORT_MIN
    accepted = (f"must be HOST:PORT with HOST an IP address or localhost (IPv6 in brackets: [::1]:3128"
                + (", no HOST: every address" if empty_host == "" else f", no HOST: {empty_host}" if empty_host else "")
                + f") and a port from {low} to {PORT_MAX} in ASCII digits"
                + (" (0: any free port)" if any_port else "") + ", for example 127.0.0.1:3128")
    if not isinstance(text, str) or len(text) > HOST_PORT_MAX or not text.isascii():
        raise ValueError(accepted)
    name, sep, port_text = text.rpartition(":")
    try:
        number = integer(port_text, minimum=low, maximum=PORT_MAX)
    except ValueError:
        raise ValueError(accepted) from None
    if not sep:
        raise ValueError(accepted)
    if name == "":
        if empty_host is None:
            raise ValueError(accepted)
        return empty_host, number
    if name == "localhost":
        return LOCALHOST, number
    return _ip_host(name, accepted), number


def cidr(text: str, *, strict: bool = False,
         prefix_required: bool = False) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """A network in CIDR form (``10.96.0.0/12``); host bits are cleared unless ``strict``.

    A bare address is one host (``/32`` or ``/128``) unless ``prefix_required``: where a
    person means a network (a route), ``10.96.0.0`` alone is far more often a forgotten
    ``/12`` than one address, so it is refused, showing both forms."""
    if not isinstance(text, str) or len(text) > CIDR_MAX or not text.isascii():
        raise ValueError("must be a network in CIDR form, for example 10.96.0.0/12")
    address, sep, prefix = text.partition("/")
    if not sep and prefix_required:
        raise ValueError(f"has no prefix length: write the network in CIDR form, for example {address}/12 for a "
                         f"network or {address}/{128 if ':' in address else 32} for this one address")
    if sep and not _DIGITS_RE.fullmatch(prefix):  # ipaddress itself reads int() of the prefix
        raise ValueError("must be a network in CIDR form, for example 10.96.0.0/12")
    try:
        return ipaddress.ip_network(text, strict=strict)
    except ValueError:
        raise ValueError("must be a network in CIDR form, for example 10.96.0.0/12"
                         + (" with no host bits set" if strict else "")) from None


_IPV4_CIDR_RE = re.compile(r"(0|[1-9][0-9]{0,2})\.(0|[1-9][0-9]{0,2})\.(0|[1-9][0-9]{0,2})\.(0|[1-9][0-9]{0,2})"
                           r"/(0|[1-9][0-9]?)")


def cidr_text(text: str) -> str:
    """:func:`cidr` as canonical text (host bits cleared), e.g. for a wire format.

    The form every engine and the wire carry, a canonical IPv4 network with no host bits
    (``10.254.0.7/32``), is checked without building an :mod:`ipaddress` object (a peer set
    of thousands is encoded at once); anything else goes through :func:`cidr`. Same
    acceptance, same ValueError.
    """
    match = _IPV4_CIDR_RE.fullmatch(text) if isinstance(text, str) else None
    if match is not None:
        a, b, c, d, prefix = (int(g) for g in match.groups())
        if a < 256 and b < 256 and c < 256 and d < 256 and prefix <= 32:
            value = a << 24 | b << 16 | c << 8 | d
            if not value & ((1 << (32 - prefix)) - 1):
                return text
    return str(cidr(text))


def arg_type(parser: Callable[..., object], **options: object) -> Callable[[str], str]:
    """An argparse ``type=`` that checks the text with ``parser`` (a function of this module)
    and keeps the text as given; a refusal becomes argparse's one-line error naming the
    option (``argument --listen: '127.0.0.1:0' must be ...``) and exit status 2."""
    import argparse

    def check(text: str) -> str:
        try:
            parser(text, **options)
        except ValueError as err:
            raise argparse.ArgumentTypeError(f"{text!r} {err}") from None
        return text

    check.__name__ = getattr(parser, "__name__", "value")
    return check
