"""Options of ``anex-agent run`` about the workload itself (parsed at the edge, frozen).

| flag | variable | accepted / default |
|---|---|---|
| ``--grace-period`` | ``ANEX_GRACE_PERIOD`` | seconds (0-86400, default 30) between a terminating signal and SIGKILL to the workload's process group |
| ``--wait-ready`` | ``ANEX_WAIT_READY`` | seconds (0-3600) the workload waits for a gateway to answer before it starts anyway (default 20; 0: at once) |
| - | ``ANEX_PUSH_DIRS`` | absolute directories, ``:``-separated, the cluster may push files into (``PUT /files``); default none: pushing is off |
| - | ``ANEX_LOGS`` | ``1`` (default): the workload's stdout/stderr are pipes, copied unchanged to the agent's and kept for ``GET /logs``; ``0``: it inherits the agent's (a terminal stays a terminal) |
| - | ``ANEX_RESTART_POLICY`` | ``Never`` (default: the agent ends with the workload), ``OnFailure`` or ``Always``: the workload is started again in place after it exits, with a kubelet's back-off (:mod:`.restart_policy`) |
| - | ``ANEX_PROBES`` | the pod's startup, liveness and readiness probes as JSON (:mod:`.probe_spec`; the virtual node writes it); default none |
| - | ``ANEX_POD_FILES`` | ``{"dirs": [...]}``: the pod's files (ConfigMap and Secret volumes) and Secret variables are pushed by the cluster; the workload waits for them (:mod:`.pod_files`); default none |
| - | ``ANEX_PROXY_ENV`` | ``1``: the workload gets ``HTTP_PROXY``/``HTTPS_PROXY``/``NO_PROXY`` (and lower case) for the agent's proxy; default ``0`` |

A bad value raises :class:`~anex_agent.errors.ConfigError` naming the flag or variable.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from anex_agent.agent import pod_files, probe_spec
from anex_agent.agent.probe_spec import ProbeSet
from anex_agent.agent.restart_policy import parse_policy
from anex_agent.agent.workload import DEFAULT_GRACE
from anex_agent import parse
from anex_agent.errors import ConfigError, env_value

#: hosts the workload reaches directly when ANEX_PROXY_ENV=1
NO_PROXY = "localhost,127.0.0.1,::1"
_SECONDS = re.compile(r"[0-9]{1,6}(\.[0-9]{1,3})?")


@dataclass(frozen=True)
class RunOptions:
    grace: float = DEFAULT_GRACE
    wait_ready: float | None = None
    proxy_env: bool = False
    capture_logs: bool = True
    push_dirs: tuple[str, ...] = ()
    restart_policy: str = "Never"
    probes: ProbeSet = ProbeSet()
    pod_files: pod_files.Manifest | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--grace-period", metavar="SECONDS",
                        help="after SIGTERM, how long the workload may take before its process group is killed "
                             "(default 30) [ANEX_GRACE_PERIOD]")
    parser.add_argument("--wait-ready", metavar="SECONDS",
                        help="hold the workload until a gateway answers, at most SECONDS (default 20; 0: start at "
                             "once); the agent logs when the tunnel is ready [ANEX_WAIT_READY]")


def _seconds(value: str, source: str, top: float) -> float:
    if not _SECONDS.fullmatch(value.strip()) or not 0 <= float(value) <= top:
        raise ConfigError(source, f"{value!r} is not a number of seconds from 0 to {top:g} (ASCII digits, e.g. 30 or 2.5)")
    return float(value)


def from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> RunOptions:
    def pick(flag: str | None, flag_name: str, var: str) -> tuple[str | None, str]:
        if flag is not None:
            return flag, flag_name
        return environ.get(var), var

    grace, source = pick(args.grace_period, "--grace-period", "ANEX_GRACE_PERIOD")
    wait, wsource = pick(args.wait_ready, "--wait-ready", "ANEX_WAIT_READY")
    proxy = env_value(environ, "ANEX_PROXY_ENV", parse.boolean, False)
    capture = env_value(environ, "ANEX_LOGS", parse.boolean, True)
    push_dirs = []
    for entry in filter(None, environ.get("ANEX_PUSH_DIRS", "").split(":")):
        if not entry.startswith("/") or "\0" in entry or ".." in entry.split("/"):
            raise ConfigError("ANEX_PUSH_DIRS", f"{entry!r} is not an absolute directory without '..'")
        push_dirs.append(os.path.realpath(entry))
    return RunOptions(
        probes=probe_spec.parse(environ.get("ANEX_PROBES")),
        pod_files=pod_files.parse(environ.get("ANEX_POD_FILES")),
        restart_policy=parse_policy(environ.get("ANEX_RESTART_POLICY") or "Never"),
        push_dirs=tuple(push_dirs),
        capture_logs=capture,
        grace=_seconds(grace, source, 86400) if grace else DEFAULT_GRACE,
        wait_ready=_seconds(wait, wsource, 3600) if wait else None,
        proxy_env=proxy,
    )


def proxy_variables(proxy_host: str, proxy_port: int) -> dict[str, str]:
    """The proxy variables (both cases) pointing the workload at the agent's proxy."""
    host = f"[{proxy_host}]" if ":" in proxy_host else proxy_host
    url = f"http://{host}:{proxy_port}"
    env = {"HTTP_PROXY": url, "HTTPS_PROXY": url, "NO_PROXY": NO_PROXY}
    return {**env, **{name.lower(): value for name, value in env.items()}}
