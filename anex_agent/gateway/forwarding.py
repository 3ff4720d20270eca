"""IP forwarding for the gateway (sysctl ``net.ipv4.ip_forward`` / ``net.ipv6.conf.all.forwarding``).

Choice (documented in docs/gateway.md): the gateway turns forwarding on at start and,
on a clean exit, puts back the value it found, but only if it changed it. The setting
is per network namespace. If something else on the host needs forwarding, it had it on
already, and we leave it on.
"""

from __future__ import annotations

from pathlib import Path

from anex_agent.errors import EngineError

IPV4 = Path("/proc/sys/net/ipv4/ip_forward")
IPV6 = Path("/proc/sys/net/ipv6/conf/all/forwarding")


def _read(path: Path) -> str:
    return path.read_text().strip()


def enable(path: Path = IPV4) -> str | None:
    """Turn forwarding on; returns the previous value when we changed it (None otherwise)."""
    try:
        previous = _read(path)
        if previous == "1":
            return None
        path.write_text("1\n")
    except OSError as err:
        raise EngineError(f"cannot enable IP forwarding ({path}): {err.strerror or err}") from None
    return previous


def restore(previous: str | None, path: Path = IPV4) -> None:
    """Put back what :func:`enable` found (nothing to do when it returned None)."""
    if previous is None:
        return
    try:
        path.write_text(previous + "\n")
    except OSError:
        pass
