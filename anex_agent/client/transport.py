"""How agents and gateways reach the coordinator: the URL check and the TLS client context.

Shared by the agent's and the gateway's settings parsing (one rule, one place) and by
:class:`anex_agent.client.rest.CoordinatorClient`.

Contract:
* :func:`check_coordinator_url` runs while settings are parsed, before any connection.
  ``https://`` is always accepted. ``http://`` sends the join token and the node or
  gateway credential in clear text, so it is refused (ConfigError naming the flag or
  variable and ``ANEX_ALLOW_INSECURE``/``--allow-insecure``) when the host is, or resolves
  to, any public address -- or does not resolve at all, since then nobody can tell.
  Loopback addresses are accepted silently (nothing leaves the machine); private ones
  (RFC 1918, RFC 6598, IPv6 ULA, link-local) are accepted with one warning at start.
  Resolving a name sends a DNS query, nothing to the coordinator.
* :func:`client_ssl_context` verifies the coordinator's certificate and host name
  against the system CA store, plus the PEM certificates in ``ca_file`` (a private CA)
  when given; TLS 1.2 or newer.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import ssl
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from urllib.parse import urlsplit

from anex_agent import parse
from anex_agent.errors import ConfigError, env_value

log = logging.getLogger(__name__)

ALLOW_INSECURE_VAR = "ANEX_ALLOW_INSECURE"
CA_FILE_VAR = "ANEX_CA_FILE"

Resolver = Callable[[str], Iterable[str]]


def allow_insecure_from(environ: Mapping[str, str]) -> bool:
    """``ANEX_ALLOW_INSECURE`` as a bool (:func:`anex_agent.parse.boolean`; unset or empty: false)."""
    return env_value(environ, ALLOW_INSECURE_VAR, parse.boolean, False)


def _resolve(host: str) -> list[str]:
    infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    return [str(info[4][0]) for info in infos]


def _kind(address: str) -> str:
    """``loopback``, ``private`` or ``public`` for one IP address."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # drop an IPv6 zone id
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return "loopback"
    if ip.is_global or ip.is_multicast or ip.is_unspecified:
        return "public"
    return "private"


def check_coordinator_url(
    url: str,
    source: str,
    *,
    allow_insecure: bool,
    allow_hint: str = f"{ALLOW_INSECURE_VAR}=1",
    resolve: Resolver = _resolve,
) -> str:
    """Check ``url`` (already ``http(s)://host...``) as described in the module contract.

    Returns ``"https"``, ``"loopback"``, ``"private"`` or ``"insecure"`` (plain http to a
    public or unknown host, allowed by ``allow_insecure``) -- what was decided, for tests.
    """
    parts = urlsplit(url)
    if parts.scheme == "https":
        return "https"
    host = parts.hostname or ""
    why = ("plain http:// carries the join token and the node/gateway credential in clear text; "
           "use an https:// coordinator URL")
    try:
        addresses = [host] if _is_ip(host) else list(resolve(host))
    except (OSError, UnicodeError):
        addresses = []
    kinds = {_kind(a) for a in addresses}
    if not addresses or "public" in kinds:
        if allow_insecure:
            log.warning("coordinator %s is plain http:// to a %s address (allowed by %s): tokens and credentials "
                        "cross the network in clear text", url, "public" if addresses else "unresolvable", allow_hint)
            return "insecure"
        what = (f"{host!r} is or resolves to a public address ({', '.join(sorted(set(addresses)))})" if addresses
                else f"{host!r} does not resolve, so it may be a public address")
        raise ConfigError(source, f"{url!r}: {what}; {why}, or set {allow_hint} to accept the risk")
    if kinds == {"loopback"}:
        return "loopback"
    log.warning("coordinator %s is plain http:// to a private address: tokens and credentials cross the local "
                "network in clear text; use https:// where that network is shared", url)
    return "private"


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True


def parse_ca_file(value: str | None, source: str) -> Path | None:
    """``value`` as a readable PEM CA file (checked by loading it), or None when empty."""
    if not value:
        return None
    path = Path(value)
    client_ssl_context(path, source=source)
    return path


def client_ssl_context(ca_file: Path | None = None, *, source: str = CA_FILE_VAR) -> ssl.SSLContext:
    """A verifying client context: system CAs plus ``ca_file``; ConfigError naming ``source`` when it is unusable."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca_file is not None:
        try:
            context.load_verify_locations(cafile=str(ca_file))
        except FileNotFoundError:
            raise ConfigError(source, f"{ca_file}: no such file") from None
        except PermissionError:
            raise ConfigError(source, f"{ca_file}: not readable") from None
        except (ssl.SSLError, OSError) as err:
            raise ConfigError(source, f"{ca_file}: not a PEM file of CA certificates ({err})") from None
    return context
