"""``anex-agent run [options] -- CMD ARGS...``: join the mesh, then run the workload.

The container entrypoint. Settings come from the flags or the ANEX_* / GW_TUNNEL_*
environment (see :mod:`anex_agent.agent.settings`); they are checked, including that
every GW_TUNNEL port is free, before anything starts. The workload starts once the proxy
and the forwards are up and a gateway answered (``--wait-ready`` seconds at most); the agent
acts as its init (:mod:`anex_agent.agent.run_options`, :mod:`.workload`, :mod:`.reaper`);
``run`` exits with its status and tears the mesh down.

The workload (and every process the agent starts) gets no ``ANEX_*`` secret: see
:mod:`anex_agent.host.childenv`. ``--user NAME`` / ``ANEX_WORKLOAD_USER`` runs it as another
account (the agent must be root), so it cannot read the state dir or the agent's
``/proc/<pid>/environ``.
"""

from __future__ import annotations

import argparse
import asyncio
import os

import anex_agent
from anex_agent.host import childenv, statelock
from anex_agent.host.sdnotify import Notifier
from anex_agent.agent import pod_files, run_options
from anex_agent.agent import settings as agent_settings
from anex_agent.agent.container_state import StateTracker, oom_counter_path
from anex_agent.agent.logs import LogStore
from anex_agent.agent.probes import Prober
from anex_agent.agent.workload import Workload, check_command, resolve_account
from anex_agent.agent.workload_lifetime import RECORD_FILE, WorkloadRecord

WORKLOAD_USER_VAR = "ANEX_WORKLOAD_USER"


def configure(parser: argparse.ArgumentParser) -> None:
    agent_settings.add_arguments(parser)
    parser.add_argument(
        "--user", metavar="NAME", help=f"run the workload as this user (the agent must be root) [{WORKLOAD_USER_VAR}]"
    )
    run_options.add_arguments(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ARGS", help="the workload to run")
    parser.usage = "anex-agent run [options] -- CMD ARGS..."


def main(args: argparse.Namespace) -> int:
    from anex_agent.agent.cli_detect import detect_report
    from anex_agent.agent.stopping import ExitDeadline
    from anex_agent.agent.supervisor import Agent

    childenv.take_out_of_process_environ(os.environ)  # /proc/<pid>/environ: no secret, used or not
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    check_command(command)
    settings = agent_settings.from_args(args, os.environ)
    account = None
    if args.user or os.environ.get(WORKLOAD_USER_VAR):
        source = "--user" if args.user else WORKLOAD_USER_VAR
        account = resolve_account(args.user or os.environ[WORKLOAD_USER_VAR], source, euid=os.geteuid())
    lock = statelock.acquire(settings.state_dir, "run")  # noqa: F841 - held until exit; one instance per state dir
    options = run_options.from_args(args, os.environ)
    agent_settings.check_ports_free(settings)
    notifier = Notifier.from_environ(os.environ)  # under systemd: READY=1 once the tunnel is up, watchdog
    Notifier.scrub(os.environ)  # the workload does not talk to systemd in the agent's name
    env = childenv.workload_env(os.environ, account)
    if options.proxy_env:
        env.update(run_options.proxy_variables(settings.proxy_listen.host, settings.proxy_listen.port))
    logs = LogStore(settings.state_dir / "logs") if options.capture_logs else None
    workload = Workload(command, env=env, account=account, grace=options.grace,
                        tracker=StateTracker(_oom_counter()), logs=logs,
                        record=WorkloadRecord(settings.state_dir / RECORD_FILE), restart_policy=options.restart_policy,
                        prober=Prober(options.probes) if options.probes else None)
    childenv.scrub_environ(os.environ)  # nothing the agent starts later inherits a secret either
    push_dirs, delivery = options.push_dirs, None
    if options.pod_files is not None:  # the cluster pushes the pod's files before the workload starts
        push_dirs += pod_files.prepare(options.pod_files,
                                       reserved=(str(settings.state_dir), os.path.dirname(anex_agent.__file__)))
        delivery = pod_files.Delivery(options.pod_files)
    agent = Agent(settings, detect_report=detect_report, wait_ready=options.wait_ready, notifier=notifier,
                  push_dirs=push_dirs, exit_deadline=ExitDeadline(enabled=True), pod_files=delivery)
    return asyncio.run(agent.run(workload))


def _oom_counter():
    """The file with the OOM-kill counter of the agent's cgroup (OOMKilled detection), or None."""
    try:
        with open("/proc/self/cgroup") as f:
            return oom_counter_path(f.read())
    except OSError:
        return None
