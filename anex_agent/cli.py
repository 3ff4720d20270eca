"""The ``anex-agent`` command: one entry point, many roles.

Each subcommand lives in its own module, imported only when that subcommand runs
(so ``anex-agent run`` does not import the coordinator's database drivers). A
subcommand module provides:

    def configure(parser: argparse.ArgumentParser) -> None   # add its flags
    def main(args: argparse.Namespace) -> int               # run; return the exit status

Exit statuses: 0 success, 1 failure at run time, 2 bad input (a ConfigError, printed
as one line naming the input, without a traceback), 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from anex_agent import __version__
from anex_agent.errors import AnexError, ConfigError

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "coordinator": ("anex_agent.coordinator.cli", "run the coordinator REST service"),
    "gateway": ("anex_agent.gateway.cli", "run the cluster-side gateway (WireGuard hub, relay, routes, DNS)"),
    "virtual-node": ("anex_agent.virtualnode.cli", "run the virtual node: Kubernetes Nodes whose pods run on rented "
                     "machines"),
    "run": ("anex_agent.agent.cli_run", "join the mesh and run a workload: anex-agent run -- CMD ARGS..."),
    "daemon": ("anex_agent.agent.cli_daemon", "join the mesh and keep it up (for systemd on on-prem nodes)"),
    "detect": ("anex_agent.agent.cli_detect", "probe which WireGuard engines and paths work here"),
    "cleanup": ("anex_agent.agent.cli_cleanup", "remove interfaces, routes, rules and processes left by a crash"),
    "qualify": ("anex_agent.gpu.qualify_cli", "check an on-prem server against the hardware rules"),
    "ssh": ("anex_agent.remote.ssh_client", "a shell or command on a node with a short-lived certificate: ssh NODE [-- CMD]"),
    "cp": ("anex_agent.remote.cp_client", "copy files to or from a node over SFTP: cp [-r] SRC DST (one is NODE:PATH)"),
    "admin": ("anex_agent.admin.cli", "manage a coordinator: tokens, nodes, gateways, provisions, bans (list, show, create, delete)"),
    "demo": ("anex_agent.demo", "build a local end-to-end mesh in network namespaces and check it (root)"),
}


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = [f"usage: anex-agent [--version] [-v] COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {helptext}" for name, (_, helptext) in COMMANDS.items()]
    lines += ["", "Run 'anex-agent COMMAND --help' for a command's options."]
    return "\n".join(lines)


def setup_logging(verbosity: int) -> None:
    level = logging.DEBUG if verbosity > 0 else getattr(logging, os.environ.get("ANEX_LOG_LEVEL", "INFO").upper(), logging.INFO)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    verbosity = 0
    while argv and argv[0] in ("-v", "--verbose"):
        verbosity += 1
        argv.pop(0)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] == "--version":
        print(f"anex-agent {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"anex-agent: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(COMMANDS[name][0])
    except ModuleNotFoundError as err:  # a build without this role's libraries (the single-file agent)
        print(f"anex-agent {name}: not available in this build: the module {err.name!r} is missing; "
              "install the anex-agent package with pip to use this command", file=sys.stderr)
        return 1
    parser = argparse.ArgumentParser(prog=f"anex-agent {name}", description=COMMANDS[name][1])
    parser.add_argument("-v", "--verbose", action="count", default=verbosity, help="log debug messages")
    module.configure(parser)
    args = parser.parse_args(rest)
    setup_logging(args.verbose)
    try:
        return int(module.main(args) or 0)
    except ConfigError as err:
        print(f"anex-agent {name}: {err}", file=sys.stderr)
        return 2
    except AnexError as err:
        print(f"anex-agent {name}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
