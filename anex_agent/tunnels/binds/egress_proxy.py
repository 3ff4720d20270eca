"""Which HTTP proxy a connection to a URL goes through, from ``HTTPS_PROXY``/``HTTP_PROXY``/``NO_PROXY``.

:func:`proxy_for` reads an environment mapping given by the caller (read once at the edge) and
answers ``http://HOST:PORT`` or None; the connection then goes through the proxy with HTTP
CONNECT. The agent uses it for the relay (:class:`.relay_client.RelayTarget`) and for the
coordinator. No I/O; websockets is not imported.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit


def proxy_for(url: str, environ: Mapping[str, str]) -> str | None:
    """The HTTP proxy for ``url`` per ``HTTPS_PROXY``/``HTTP_PROXY``/``NO_PROXY`` (either case), or None.

    ``wss://`` and ``https://`` use ``HTTPS_PROXY``, ``ws://`` and ``http://`` ``HTTP_PROXY``,
    with no fallback from one to the other (a proxy for one scheme is not assumed to serve the
    other). The agent uses it for the relay and for the coordinator.
    ``NO_PROXY``: comma-separated host names, domain suffixes (``.corp`` or ``corp``), IP
    literals, or ``*``.
    """
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()

    def get(name: str) -> str:
        return environ.get(name.lower()) or environ.get(name.upper()) or ""

    proxy = get("https_proxy" if parts.scheme in ("wss", "https") else "http_proxy").strip()
    if not proxy:
        return None
    for entry in (e.strip().lower() for e in get("no_proxy").split(",")):
        if not entry:
            continue
        if entry == "*":
            return None
        entry = entry.split(":")[0] if entry.count(":") == 1 else entry
        bare = entry.lstrip(".")
        if host == bare or host.endswith("." + bare):
            return None
    return proxy if "://" in proxy else f"http://{proxy}"
