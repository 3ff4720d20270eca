"""Names of the interfaces we create: ``anx`` (:data:`IFNAME_PREFIX`) and something unique.

Every engine with an OS interface (and wireguard-go's UAPI socket) is named so, which is how
``anex-agent cleanup`` (:mod:`anex_agent.tunnels.engines.cleanup`) finds what a crash left.
:func:`new_ifname` makes a fresh one; :func:`check_ifname` refuses a name Linux would not take
(:class:`anex_agent.errors.ConfigError` naming ``interface``).
"""

from __future__ import annotations

from anex_agent.errors import ConfigError

#: Interfaces (and wireguard-go UAPI sockets) we create are named ``anx<something>``.
IFNAME_PREFIX = "anx"
#: Linux IFNAMSIZ is 16 including the terminating NUL (include/uapi/linux/if.h).
IFNAME_MAX = 15


def new_ifname(role: str = "") -> str:
    """A fresh, machine-unique-enough interface name: ``anx`` + role letter(s) + random hex (<= 15 chars)."""
    import secrets

    return check_ifname(f"{IFNAME_PREFIX}{role[:3]}{secrets.token_hex(4)}")


def check_ifname(ifname: str) -> str:
    """Validate an interface name we will create; returns it or raises ConfigError."""
    if not ifname or len(ifname) > IFNAME_MAX or "/" in ifname or any(c.isspace() for c in ifname):
        raise ConfigError("interface", f"{ifname!r} is not a valid interface name (1-{IFNAME_MAX} characters, no '/' or spaces)")
    return ifname
