"""The environment of every process the agent starts: the workload and the engines.

The workload is the customer's code, often root in its container: it must never see a join
token, a gateway or admin token, or the proxy password. The engines (wireguard-go,
wireproxy) need almost nothing from us. So:

* :func:`workload_env`: the agent's environment minus every ``ANEX_*`` variable except
  :data:`WORKLOAD_ALLOWED` (harmless names the workload may use to find the agent's
  listeners); deny by default, so a secret added later is stripped too. Everything that is
  not ``ANEX_*`` (``PATH``, ``GW_TUNNEL_*``, the workload's own variables) stays. With a
  :class:`~anex_agent.host.childenv.AccountInfo` the workload runs as that account: ``HOME``,
  ``USER`` and ``LOGNAME`` are set for it.
* :func:`engine_env`: ``PATH`` plus the few names an engine reads (:data:`ENGINE_NAMES`,
  ``WG_*``); nothing else of the agent's environment.
* :func:`scrub_environ`: removes the same ``ANEX_*`` variables from the agent's own
  ``os.environ`` once its settings are parsed, so nothing started later inherits them. The
  kernel shows the environment the process was started with in ``/proc/<pid>/environ``:
  :func:`take_out_of_process_environ` blanks their values there too
  (:mod:`anex_agent.host.environ_block`; see docs/agent.md).

Pure functions of the mapping given (but :func:`take_out_of_process_environ`, which writes
this process's start-up environment block); no function here reads ``os.environ`` by itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

#: ``ANEX_*`` variables the workload keeps: where the agent's listeners are and what this
#: node is called. None of them is a secret; every other ``ANEX_*`` name is removed
#: (ANEX_JOIN_TOKEN, ANEX_PROXY_AUTH, ANEX_GATEWAY_TOKEN, ANEX_ADMIN_TOKEN, ANEX_DATABASE_URL,
#: ANEX_COORDINATOR_URL (it may carry credentials), ANEX_STATE_DIR, any *_FILE twin, ...).
WORKLOAD_ALLOWED = frozenset(
    {
        "ANEX_PROXY_LISTEN",
        "ANEX_SOCKS_LISTEN",
        "ANEX_API_LISTEN",
        "ANEX_NODE_NAME",
        "ANEX_PROVIDER",
        "ANEX_INBOUND_PORTS",
        "ANEX_ENGINE",
        "ANEX_PATH",
        "ANEX_LOG_LEVEL",
    }
)

#: what an engine process may read besides ``PATH`` and ``WG_*`` (wireguard-go's LOG_LEVEL,
#: the Go runtime's tuning knobs)
ENGINE_NAMES = frozenset({"LOG_LEVEL", "GOMAXPROCS", "GOGC", "GOMEMLIMIT", "GODEBUG"})

PREFIX = "ANEX_"


@dataclass(frozen=True)
class AccountInfo:
    """The account the workload runs as (from the password database)."""

    name: str
    uid: int
    gid: int
    home: str
    groups: tuple[int, ...] = ()


def withheld(name: str) -> bool:
    """True for a variable the workload (and anything the agent starts later) must not get."""
    return name.startswith(PREFIX) and name not in WORKLOAD_ALLOWED


def workload_env(environ: Mapping[str, str], account: AccountInfo | None = None) -> dict[str, str]:
    """The workload's environment: ``environ`` without withheld ``ANEX_*`` names; with
    ``account``, HOME/USER/LOGNAME are that account's."""
    env = {name: value for name, value in environ.items() if not withheld(name)}
    if account is not None:
        env.update(HOME=account.home, USER=account.name, LOGNAME=account.name)
    return env


def engine_env(environ: Mapping[str, str]) -> dict[str, str]:
    """A minimal environment for an engine process: PATH (or the system default), the names in
    :data:`ENGINE_NAMES` and ``WG_*`` that ``environ`` holds; nothing else."""
    env = {name: value for name, value in environ.items() if name in ENGINE_NAMES or name.startswith("WG_")}
    env["PATH"] = environ.get("PATH") or os.defpath
    return env


def scrub_environ(environ: MutableMapping[str, str]) -> list[str]:
    """Remove withheld ``ANEX_*`` names from ``environ`` (the agent's own ``os.environ``, after
    its settings were parsed); return the names removed."""
    names = sorted(name for name in environ if withheld(name))
    for name in names:
        del environ[name]
    return names


def take_out_of_process_environ(environ: Mapping[str, str]) -> None:
    """Blank the values of the withheld ``ANEX_*`` variables in this process's start-up
    environment block (``/proc/<pid>/environ``), whether they are used or not; call it first
    thing, before anything is started. ``environ`` (``os.environ``, a copy) is left as it is
    for the settings to be parsed from. Logs when the block cannot be written."""
    import logging

    from anex_agent.host.environ_block import blank_environ_values

    if not any(withheld(name) for name in environ):
        return
    if blank_environ_values(withheld) is None:
        logging.getLogger(__name__).warning(
            "cannot take the ANEX_* variables out of /proc/%d/environ on this system: a process of this "
            "user (or root) can read them while the agent runs; give secrets as files (ANEX_JOIN_TOKEN_FILE)",
            os.getpid())
