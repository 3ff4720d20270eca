"""``anex-agent daemon``: join the mesh and keep it up until SIGTERM/SIGINT (systemd).

The same as ``run`` without a workload; see ``systemd/anex-agent.service``. Under systemd
(``Type=notify``) it sends ``READY=1`` once a gateway answered, ``STATUS=`` lines, and
watchdog pings from its event loop (:mod:`anex_agent.host.sdnotify`).
"""

from __future__ import annotations

import argparse
import asyncio
import os

from anex_agent.host import childenv, statelock
from anex_agent.host.sdnotify import Notifier
from anex_agent.agent import settings as agent_settings


def configure(parser: argparse.ArgumentParser) -> None:
    agent_settings.add_arguments(parser)


def main(args: argparse.Namespace) -> int:
    from anex_agent.agent.cli_detect import detect_report
    from anex_agent.agent.stopping import ExitDeadline
    from anex_agent.agent.supervisor import Agent

    childenv.take_out_of_process_environ(os.environ)  # /proc/<pid>/environ: no secret, used or not
    settings = agent_settings.from_args(args, os.environ)
    lock = statelock.acquire(settings.state_dir, "daemon")  # noqa: F841 - held until exit; one instance per state dir
    agent_settings.check_ports_free(settings)
    childenv.scrub_environ(os.environ)  # nothing the agent starts inherits a secret
    notifier = Notifier.from_environ(os.environ)  # Type=notify: READY=1 once the tunnel is up, watchdog
    Notifier.scrub(os.environ)
    agent = Agent(settings, detect_report=detect_report, notifier=notifier, exit_deadline=ExitDeadline(enabled=True))
    return asyncio.run(agent.run(None))
