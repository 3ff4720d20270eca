"""``anex-agent admin RESOURCE VERB``: the operator's view of a coordinator (join tokens, nodes,
gateways, provisions, machine bans) without curl.

    anex-agent admin tokens     list | show ID | create [--kind node|gateway] [--reusable] [--max-uses N]
                                [--ttl 1h] [--label K=V]... [--provider P]... [--out FILE] | delete ID
    anex-agent admin nodes      list | show NODE | delete NODE           (NODE: id or unique name)
    anex-agent admin gateways   list | show GATEWAY | delete GATEWAY
    anex-agent admin provisions list | show PROVISION | create [--file FILE|-] [--name N] [--image I]
                                [--annotation K=V]... [--env K=V]... [--port N]... [--disk-gb G]
                                [--agent entrypoint|download] [-- COMMAND ARGS...] | delete PROVISION
    anex-agent admin bans       list | show MACHINE_ID | create MACHINE_ID [--reason R] [--duration 1d]
                                | delete MACHINE_ID

Common options (before or after RESOURCE VERB): ``--coordinator URL`` [``ANEX_COORDINATOR_URL``],
``--token-file FILE`` [``ANEX_ADMIN_TOKEN``, ``ANEX_ADMIN_TOKEN_FILE``; never the token itself on
the command line], ``--ca-file FILE`` [``ANEX_CA_FILE``], ``--allow-insecure``
[``ANEX_ALLOW_INSECURE=1``: plain http:// to a public address], ``-o table|json`` / ``--json``.

Output: a table (``list``), one object's fields (``show``, ``create``), or what was done
(``delete``); with ``-o json`` the coordinator's JSON answer, unchanged. Secrets: only
``tokens create`` prints one, the join token just created (or writes it, mode 0600, to ``--out``).
Exit status: 0 done; 2 bad input, an unknown id or name, or a refused admin token (one line
naming the flag, variable or argument); 1 the coordinator unreachable or another failure.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from anex_agent.errors import ConfigError

RESOURCES = {
    "tokens": ("join tokens for nodes and gateways", ("list", "show", "create", "delete"), "TOKEN_ID"),
    "nodes": ("nodes of the mesh (they join with a node token: no create)", ("list", "show", "delete"), "NODE"),
    "gateways": ("gateways (they register with a gateway token: no create)", ("list", "show", "delete"), "GATEWAY"),
    "provisions": ("machines rented and booted for pods", ("list", "show", "create", "delete"), "PROVISION"),
    "bans": ("Vast.AI machines the selection skips", ("list", "show", "create", "delete"), "MACHINE_ID"),
}
ID_HELP = {"TOKEN_ID": "join token id", "NODE": "node id or unique name", "GATEWAY": "gateway id or unique name",
           "PROVISION": "provision id or name", "MACHINE_ID": "Vast.AI machine id"}


def _add_common(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """The options every admin command takes, before or after RESOURCE VERB: at the top with
    their defaults, on each VERB without (so a value given at the top is not reset there)."""
    keep = argparse.SUPPRESS
    group = parser.add_argument_group("coordinator")
    group.add_argument("--coordinator", metavar="URL", default=None if top else keep,
                       help="coordinator URL [ANEX_COORDINATOR_URL]")
    group.add_argument("--token-file", "--admin-token-file", dest="token_file", metavar="FILE",
                       default=None if top else keep,
                       help="file holding the admin token [ANEX_ADMIN_TOKEN, ANEX_ADMIN_TOKEN_FILE]")
    group.add_argument("--token", dest="token_on_command_line", default=None if top else keep, help=keep)
    group.add_argument("--ca-file", metavar="FILE", default=None if top else keep,
                       help="PEM CA for an https:// coordinator with a private CA [ANEX_CA_FILE]")
    group.add_argument("--allow-insecure", action="store_true", default=False if top else keep,
                       help="accept plain http:// to a public coordinator address [ANEX_ALLOW_INSECURE=1]")
    group.add_argument("-o", "--output", choices=("table", "json"), default="table" if top else keep,
                       help="table (default) or json (the coordinator's answer)")
    group.add_argument("--json", dest="output", action="store_const", const="json", default=keep,
                       help="the same as -o json")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = "manage a coordinator's join tokens, nodes, gateways, provisions and bans"
    _add_common(parser, top=True)
    leaf = argparse.ArgumentParser(add_help=False)
    _add_common(leaf, top=False)
    resources = parser.add_subparsers(dest="resource", metavar="RESOURCE", required=True)
    for resource, (helptext, verbs, id_name) in RESOURCES.items():
        sub = resources.add_parser(resource, help=helptext, description=helptext)
        actions = sub.add_subparsers(dest="verb", metavar="VERB", required=True)
        for verb in verbs:
            what = {"list": f"list {resource}", "show": f"show one of the {resource}",
                    "create": f"create one of the {resource}", "delete": f"delete one of the {resource}"}[verb]
            cmd = actions.add_parser(verb, parents=[leaf], help=what, description=what)
            if verb in ("show", "delete") or (verb == "create" and resource == "bans"):
                cmd.add_argument("id", metavar=id_name, help=ID_HELP[id_name])
            if verb == "create":
                {"tokens": _token_create, "provisions": _provision_create, "bans": _ban_create}[resource](cmd)


def _token_create(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("--kind", choices=("node", "gateway"), default="node", help="who may join with it (node)")
    cmd.add_argument("--reusable", action="store_true", help="admits any number of nodes (unless --max-uses)")
    cmd.add_argument("--max-uses", type=_positive, metavar="N", help="how many nodes or gateways it admits (1)")
    cmd.add_argument("--ttl", metavar="DURATION", help="how long it is good: 90s, 15m, 12h, 7d (1h)")
    cmd.add_argument("--label", action="append", metavar="KEY=VALUE", help="a label for every node that joins")
    cmd.add_argument("--provider", action="append", choices=("vastai", "runpod", "onprem", "other"),
                     help="node tokens: the provider a node may name when it joins (repeatable; default any)")
    cmd.add_argument("--out", metavar="FILE", help="write the token to FILE (mode 0600) instead of printing it")


def _provision_create(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("--file", metavar="FILE", help="a JSON ProvisionCreate body ('-': stdin); flags override it")
    cmd.add_argument("--name", help="unique name (the same name and body again: the same provision)")
    cmd.add_argument("--image", help="container image to run")
    cmd.add_argument("--annotation", action="append", metavar="KEY=VALUE", help="a pod annotation for the "
                     "selection, e.g. anex.sh/gpu=RTX_4090 (repeatable)")
    cmd.add_argument("--env", action="append", metavar="KEY=VALUE", help="the workload's environment (repeatable)")
    cmd.add_argument("--port", action="append", type=_port, metavar="N", help="a port to expose (repeatable)")
    cmd.add_argument("--disk-gb", type=float, metavar="GB", help="disk to allocate")
    cmd.add_argument("--agent", choices=("entrypoint", "download"), help="how the agent starts on the machine")
    cmd.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the workload's command")


def _ban_create(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("--reason", help="why (shown in the list)")
    cmd.add_argument("--duration", metavar="DURATION", help="90s, 15m, 12h, 7d (default: the coordinator's)")


def _positive(text: str) -> int:
    from anex_agent import parse

    return int(parse.arg_type(parse.integer, minimum=1, maximum=1_000_000)(text))


def _port(text: str) -> int:
    from anex_agent import parse

    return int(parse.arg_type(parse.port)(text))


async def run(args: argparse.Namespace, environ=None) -> int:
    from anex_agent.admin.api import AdminApi, settings_from
    from anex_agent.admin.output import dump_json
    from anex_agent.admin.resources import HANDLERS

    if getattr(args, "token_on_command_line", None):
        raise ConfigError("--token", "the admin token is not taken on the command line, where every user of this "
                          "host can read it (ps); use --token-file FILE, ANEX_ADMIN_TOKEN_FILE or ANEX_ADMIN_TOKEN")
    settings = settings_from(args, environ)
    async with AdminApi(settings) as api:
        shown = await HANDLERS[(args.resource, args.verb)](api, args)
    print(dump_json(shown.json) if args.output == "json" else shown.text)
    return 0


def main(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(run(args))
    finally:
        sys.stdout.flush()
