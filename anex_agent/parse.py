"""Parsing of small textual values, once for the whole product: integers, ports, HOST:PORT, CIDRs.

Contract: every function takes the text as received and either returns the parsed value
or raises :class:`ValueError` whose message says what is accepted (``"must be ..."``),
without naming the input: the caller knows whether it is a query parameter, a JSON
field, a command-line option or an environment variable, and names it (the wire
models put the field in the 422 problem; the coordinator's registry names the query
parameter; a CLI would say ``--listen: must be ...``).

Digits are ASCII digits only. ``str.isdigit`` and ``int()`` also accept other scripts'
digits (``"٣"``, ``"３"``) and ``isdigit`` even superscripts (``"²"``) that ``int()``
then refuses; a value read here is the value a person typing ASCII meant. Lengths are
bounded before any conversion, so a 5,000-digit number costs nothing.

The module imports nothing of anex-agent and no I/O: roles and cores may use it alike.
"""

from __future__ import annotations

import ipaddress
import re

MAX_INT_DIGITS = 19  # enough for any signed 64-bit value; longer input is refused before int()

PORT_MIN, PORT_MAX = 1, 65535

# RFC 1123 host names (labels of letters, digits, hyphens; underscores tolerated, as DNS
# service names use them), 253 characters at most.
HOSTNAME_MAX = 253
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOSTNAME_RE = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")
_DIGITS_RE = re.compile(r"[0-9]+")

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


def cidr(text: str, *, strict: bool = False) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """A network in CIDR form (``10.96.0.0/12``); host bits are cleared unless ``strict``."""
    if not isinstance(text, str) or len(text) > CIDR_MAX or not text.isascii():
        raise ValueError("must be a network in CIDR form, for example 10.96.0.0/12")
    address, sep, prefix = text.partition("/")
    if sep and not _DIGITS_RE.fullmatch(prefix):  # ipaddress itself reads int() of the prefix
        raise ValueError("must be a network in CIDR form, for example 10.96.0.0/12")
    try:
        return ipaddress.ip_network(text, strict=strict)
    except ValueError:
        raise ValueError("must be a network in CIDR form, for example 10.96.0.0/12"
                         + (" with no host bits set" if strict else "")) from None
