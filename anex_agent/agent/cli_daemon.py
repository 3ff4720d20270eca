"""``anex-agent daemon``: join the mesh and keep it up until SIGTERM/SIGINT (systemd).

The same as ``run`` without a workload; see ``systemd/anex-agent.service``.
"""

from __future__ import annotations

import argparse
import asyncio
import os

from anex_agent import childenv, statelock
from anex_agent.agent import settings as agent_settings


def configure(parser: argparse.ArgumentParser) -> None:
    agent_settings.add_arguments(parser)


def main(args: argparse.Namespace) -> int:
    from anex_agent.agent.cli_detect import detect_report
    from anex_agent.agent.supervisor import Agent

    settings = agent_settings.from_args(args, os.environ)
    lock = statelock.acquire(settings.state_dir, "daemon")  # noqa: F841 - held until exit; one instance per state dir
    agent_settings.check_ports_free(settings)
    childenv.scrub_environ(os.environ)  # nothing the agent starts inherits a secret
    agent = Agent(settings, detect_report=detect_report)
    return asyncio.run(agent.run(None))
