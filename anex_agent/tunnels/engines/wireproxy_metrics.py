"""wireproxy's ``/metrics``: wireguard-go's UAPI ``get`` dump (keys redacted) as peer status. Pure."""

from __future__ import annotations

import ipaddress
from typing import Any

from anex_agent.errors import EngineError
from anex_agent.wire.keys import encode_key
from anex_agent.tunnels.engines.status import PeerStatus


def parse_metrics(text: str, *, now: float | None = None) -> tuple[int, tuple[PeerStatus, ...]]:
    """(listen_port, peers) from wireproxy's ``/metrics``: a UAPI ``get`` dump, one ``key=value`` per line.

    Device keys come first (``private_key=REDACTED``, ``listen_port``); each
    ``public_key=<hex>`` starts a peer with ``endpoint``, ``last_handshake_time_sec/nsec``,
    ``rx_bytes``, ``tx_bytes``, ``allowed_ip`` (repeated)... Unknown keys are ignored;
    malformed values raise EngineError (the dump comes from a process we run).
    """
    listen_port = 0
    peers: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise EngineError(f"wireproxy /metrics line {number} is not key=value: {line[:80]!r}")
        try:
            if key == "public_key":
                peers.append({"public_key": encode_key(bytes.fromhex(value)), "allowed_ips": [],
                              "rx": 0, "tx": 0, "sec": 0, "nsec": 0, "endpoint": None})
            elif key == "listen_port" and not peers:
                listen_port = int(value)
            elif peers and key in ("rx_bytes", "tx_bytes"):
                peers[-1][key[:2]] = int(value)
            elif peers and key == "last_handshake_time_sec":
                peers[-1]["sec"] = int(value)
            elif peers and key == "last_handshake_time_nsec":
                peers[-1]["nsec"] = int(value)
            elif peers and key == "endpoint":
                peers[-1]["endpoint"] = value
            elif peers and key == "allowed_ip":
                peers[-1]["allowed_ips"].append(str(ipaddress.ip_network(value, strict=False)))
        except ValueError:
            raise EngineError(f"wireproxy /metrics line {number}: bad value for {key}: {value[:80]!r}") from None
    return listen_port, tuple(
        PeerStatus(public_key=p["public_key"], endpoint=p["endpoint"],
                   last_handshake=(p["sec"] + p["nsec"] / 1e9) if p["sec"] else None,
                   rx_bytes=p["rx"], tx_bytes=p["tx"], allowed_ips=tuple(p["allowed_ips"]))
        for p in peers
    )
