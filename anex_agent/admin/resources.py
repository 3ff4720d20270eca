"""What ``anex-agent admin RESOURCE VERB`` does with the coordinator's REST API.

Each handler takes the :class:`~anex_agent.admin.api.AdminApi` and the parsed arguments
and returns a :class:`Shown`: the JSON to print with ``-o json`` (what the coordinator
answered) and the text to print otherwise (a table, or one object's fields).

| resource | list | show | create | delete |
|---|---|---|---|---|
| tokens | ``GET /v1/join-tokens`` | from the list (no secrets) | ``POST /v1/join-tokens`` (the secret, once) | ``DELETE /v1/join-tokens/{id}`` |
| nodes | ``GET /v1/nodes`` | ``GET /v1/nodes/{id}`` (id or unique name) | nodes join with a token | ``DELETE /v1/nodes/{id}`` |
| gateways | ``GET /v1/gateways`` | from the list (id or unique name) | gateways register with a token | ``DELETE /v1/gateways/{id}`` |
| provisions | ``GET /v1/provisions`` | ``GET /v1/provisions/{id}`` (id or name) | ``POST /v1/provisions`` (``--file`` and/or flags) | ``DELETE /v1/provisions/{id}`` |
| bans | ``GET /v1/bans`` | from the list | ``POST /v1/bans`` | ``DELETE /v1/bans/{machine_id}`` |
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anex_agent import parse
from anex_agent.admin import output
from anex_agent.admin.api import AdminApi, not_found, segment
from anex_agent.errors import ConfigError, config_value

NODE_ID = re.compile(r"n-[0-9a-f]{12}")  # the coordinator's node ids (credentials.new_id)
PROVISION_ID = re.compile(r"pv-[0-9a-f]{12}")
MAX_TOKEN_TTL = 365 * 86400  # wire.JoinTokenCreate.expires_in
MAX_BAN = 365 * 86400  # selection.models.BanCreate.duration
PROVISION_FILE_MAX = 4 << 20


@dataclass(frozen=True)
class Shown:
    json: Any
    text: str


def _uses(row: Mapping[str, Any]) -> str:
    limit = row.get("max_uses")
    return f"{row.get('uses', 0)}/{'unlimited' if limit is None else limit}"


TOKEN_COLUMNS: Sequence[output.Column] = (
    ("ID", "id"), ("KIND", "kind"), ("USES", _uses), ("PROVIDERS", lambda r: r.get("providers") or "any"),
    ("LABELS", "labels"), ("CREATED", "created_at"), ("EXPIRES", "expires_at"), ("USED BY", "used_by"))
NODE_COLUMNS: Sequence[output.Column] = (
    ("ID", "id"), ("NAME", "name"), ("PROVIDER", "provider"), ("STATE", "state"), ("HEALTH", "health"),
    ("ADDRESS", "address"), ("PATH", "status.path"), ("LAST HEARTBEAT", "last_heartbeat_at"))
GATEWAY_COLUMNS: Sequence[output.Column] = (
    ("ID", "id"), ("NAME", "name"), ("ADDRESS", "address"), ("ENDPOINT", "endpoint"), ("RELAY", "ws_url"),
    ("ROUTES", "routes"), ("LAST SEEN", "last_seen_at"))
PROVISION_COLUMNS: Sequence[output.Column] = (
    ("ID", "id"), ("NAME", "name"), ("STATE", "state"), ("PROVIDER", "provider"), ("NODE", "node_id"),
    ("USD/H", "price_per_hour"), ("COST USD", lambda r: f"{r.get('cost_usd') or 0:.4f}"), ("REASON", "reason"))
BAN_COLUMNS: Sequence[output.Column] = (
    ("MACHINE", "machine_id"), ("PROVIDER", "provider"), ("CREATED", "created_at"), ("EXPIRES", "expires_at"),
    ("REASON", "reason"))


def _listed(answer: Any, key: str, columns: Sequence[output.Column]) -> Shown:
    return Shown(answer, output.table(answer.get(key, []), columns))


def _one(obj: Mapping[str, Any]) -> Shown:
    return Shown(obj, output.details(obj))


def _pick(rows: list[Mapping[str, Any]], value: str, argument: str, *, by_name: bool = True) -> Mapping[str, Any]:
    """The row whose id (or, with ``by_name``, whose unique name) is ``value``."""
    for row in rows:
        if row.get("id", row.get("machine_id")) == value:
            return row
    named = [row for row in rows if by_name and row.get("name") == value]
    if len(named) == 1:
        return named[0]
    if named:
        ids = ", ".join(str(row.get("id")) for row in named)
        raise ConfigError(argument, f"{len(named)} are called {value!r} ({ids}); give the id")
    raise not_found(argument, value)


def _pairs(values: Sequence[str] | None, flag: str) -> dict[str, str]:
    """``KEY=VALUE`` flags as a dict; ConfigError naming ``flag`` for one without ``=``."""
    out: dict[str, str] = {}
    for text in values or []:
        key, eq, value = text.partition("=")
        if not eq or not key:
            raise ConfigError(flag, f"{text!r}: expected KEY=VALUE")
        out[key] = value
    return out


# ---------------------------------------------------------------- join tokens

TOKEN_FIELDS = {"kind": "--kind", "reusable": "--reusable", "max_uses": "--max-uses", "expires_in": "--ttl",
                "labels": "--label", "providers": "--provider"}


async def tokens_list(api: AdminApi, args: Any) -> Shown:
    return _listed(await api.call("GET", "/v1/join-tokens"), "tokens", TOKEN_COLUMNS)


async def tokens_show(api: AdminApi, args: Any) -> Shown:
    listed = await api.call("GET", "/v1/join-tokens")
    return _one(_pick(listed.get("tokens", []), args.id, "TOKEN_ID", by_name=False))


async def tokens_create(api: AdminApi, args: Any) -> Shown:
    body: dict[str, Any] = {"kind": args.kind, "reusable": bool(args.reusable),
                            "expires_in": config_value("--ttl", parse.duration, args.ttl, maximum=MAX_TOKEN_TTL)
                            if args.ttl else 3600}
    if args.max_uses is not None:
        body["max_uses"] = args.max_uses
    if args.label:
        body["labels"] = _pairs(args.label, "--label")
    if args.provider:
        body["providers"] = list(dict.fromkeys(args.provider))
    created = await api.call("POST", "/v1/join-tokens", body=body, fields=TOKEN_FIELDS)
    if args.out:
        from anex_agent.host.private_file import write_private

        try:
            write_private(Path(args.out), created["token"] + "\n")
        except OSError as err:
            raise ConfigError("--out", f"{args.out}: cannot write the token ({err.strerror or err}); the token "
                              f"{created['id']} was created: revoke it with anex-agent admin tokens delete "
                              f"{created['id']}") from None
        shown = {k: v for k, v in created.items() if k != "token"}
        return Shown(shown, output.details(shown) + f"\nthe token is in {args.out} (mode 0600)")
    note = "\n(the token is shown only this once; the coordinator keeps only its hash)"
    return Shown(created, output.details(created) + note)


async def tokens_delete(api: AdminApi, args: Any) -> Shown:
    await api.call("DELETE", f"/v1/join-tokens/{segment(args.id)}", what=("TOKEN_ID", args.id))
    return Shown({"id": args.id, "deleted": True},
                 f"join token {args.id} revoked (nodes and gateways that joined with it stay)")


# ---------------------------------------------------------------- nodes


async def _node(api: AdminApi, value: str) -> Mapping[str, Any]:
    """The node whose id, or unique name, is ``value`` (an id is one lookup; only a name needs the list)."""
    if NODE_ID.fullmatch(value):
        try:
            return await api.call("GET", f"/v1/nodes/{value}", what=("NODE", value))
        except ConfigError:
            pass  # an id-shaped name, perhaps
    listed = await api.call("GET", "/v1/nodes")
    return _pick(listed.get("nodes", []), value, "NODE")


async def nodes_list(api: AdminApi, args: Any) -> Shown:
    return _listed(await api.call("GET", "/v1/nodes"), "nodes", NODE_COLUMNS)


async def nodes_show(api: AdminApi, args: Any) -> Shown:
    return _one(await _node(api, args.id))


async def nodes_delete(api: AdminApi, args: Any) -> Shown:
    node = await _node(api, args.id)
    await api.call("DELETE", f"/v1/nodes/{segment(node['id'])}", what=("NODE", args.id))
    return Shown({"id": node["id"], "deleted": True},
                 f"node {node['id']} ({output.cell(node.get('name'))}) deleted: its credential is revoked and "
                 "every gateway drops it")


# ---------------------------------------------------------------- gateways


async def gateways_list(api: AdminApi, args: Any) -> Shown:
    return _listed(await api.call("GET", "/v1/gateways"), "gateways", GATEWAY_COLUMNS)


async def gateways_show(api: AdminApi, args: Any) -> Shown:
    listed = await api.call("GET", "/v1/gateways")
    return _one(_pick(listed.get("gateways", []), args.id, "GATEWAY"))


async def gateways_delete(api: AdminApi, args: Any) -> Shown:
    listed = await api.call("GET", "/v1/gateways")
    gateway = _pick(listed.get("gateways", []), args.id, "GATEWAY")
    await api.call("DELETE", f"/v1/gateways/{segment(gateway['id'])}", what=("GATEWAY", args.id))
    return Shown({"id": gateway["id"], "deleted": True},
                 f"gateway {gateway['id']} ({output.cell(gateway.get('name'))}) deleted: nodes get a new gateway set")


# ---------------------------------------------------------------- provisions

PROVISION_FIELDS = {"name": "--name", "image": "--image", "annotations": "--annotation", "env": "--env",
                    "ports": "--port", "disk_gb": "--disk-gb", "agent": "--agent", "command": "COMMAND"}


def _provision_file(path: str) -> dict[str, Any]:
    try:
        if path == "-":
            text = sys.stdin.read(PROVISION_FILE_MAX + 1)
        else:
            with open(path, encoding="utf-8") as handle:
                text = handle.read(PROVISION_FILE_MAX + 1)
    except OSError as err:
        raise ConfigError("--file", f"{path}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise ConfigError("--file", f"{path}: not UTF-8 text; expected a JSON object") from None
    if len(text) > PROVISION_FILE_MAX:
        raise ConfigError("--file", f"{path}: larger than {PROVISION_FILE_MAX} bytes")
    try:
        body = json.loads(text)
    except ValueError as err:
        raise ConfigError("--file", f"{path}: not JSON ({err}); expected an object with name, image, command, "
                                    "annotations, env, ports, disk_gb, agent (docs/provisioning.md)") from None
    if not isinstance(body, dict):
        raise ConfigError("--file", f"{path}: expected a JSON object, not {type(body).__name__}")
    return body


def provision_body(args: Any) -> dict[str, Any]:
    """The ``POST /v1/provisions`` body: ``--file`` (if any), then each flag given over it."""
    body = _provision_file(args.file) if args.file else {}
    if args.name:
        body["name"] = args.name
    if args.image:
        body["image"] = args.image
    if args.annotation:
        body["annotations"] = {**body.get("annotations", {}), **_pairs(args.annotation, "--annotation")}
    if args.env:
        body["env"] = {**body.get("env", {}), **_pairs(args.env, "--env")}
    if args.port:
        body["ports"] = list(args.port)
    if args.disk_gb is not None:
        body["disk_gb"] = args.disk_gb
    if args.agent:
        body["agent"] = args.agent
    command = list(args.command or [])
    if command and command[0] == "--":
        command = command[1:]
    if command:
        body["command"] = command
    for required, flag in (("name", "--name"), ("image", "--image")):
        if not body.get(required):
            raise ConfigError(flag, f"is required (or {required!r} in --file)")
    return body


async def _provision(api: AdminApi, value: str) -> Mapping[str, Any]:
    if PROVISION_ID.fullmatch(value):
        try:
            return await api.call("GET", f"/v1/provisions/{value}", what=("PROVISION", value))
        except ConfigError:
            pass
    listed = await api.call("GET", "/v1/provisions")
    row = _pick(listed.get("provisions", []), value, "PROVISION")
    return await api.call("GET", f"/v1/provisions/{segment(row['id'])}", what=("PROVISION", value))


async def provisions_list(api: AdminApi, args: Any) -> Shown:
    return _listed(await api.call("GET", "/v1/provisions"), "provisions", PROVISION_COLUMNS)


async def provisions_show(api: AdminApi, args: Any) -> Shown:
    return _one(await _provision(api, args.id))


async def provisions_create(api: AdminApi, args: Any) -> Shown:
    body = provision_body(args)
    given = {"name": args.name, "image": args.image, "annotations": args.annotation, "env": args.env,
             "ports": args.port, "disk_gb": args.disk_gb, "agent": args.agent, "command": args.command}
    # a refused field is named by the flag that set it, else as the --file's field
    fields = {name: PROVISION_FIELDS[name] if given.get(name) not in (None, [], "") else f"--file ({name})"
              for name in body}
    return _one(await api.call("POST", "/v1/provisions", body=body, fields=fields))


async def provisions_delete(api: AdminApi, args: Any) -> Shown:
    provision = await _provision(api, args.id)
    view = await api.call("DELETE", f"/v1/provisions/{segment(provision['id'])}", what=("PROVISION", args.id))
    return Shown(view, f"provision {view['id']} ({view.get('name')}) is {view.get('state')}: its rental is "
                       "destroyed, then its node removed")


# ---------------------------------------------------------------- bans

BAN_FIELDS = {"machine_id": "MACHINE_ID", "reason": "--reason", "duration": "--duration"}


async def bans_list(api: AdminApi, args: Any) -> Shown:
    return _listed(await api.call("GET", "/v1/bans"), "bans", BAN_COLUMNS)


async def bans_show(api: AdminApi, args: Any) -> Shown:
    listed = await api.call("GET", "/v1/bans")
    return _one(_pick(listed.get("bans", []), args.id, "MACHINE_ID", by_name=False))


async def bans_create(api: AdminApi, args: Any) -> Shown:
    body: dict[str, Any] = {"machine_id": args.id, "reason": args.reason or ""}
    if args.duration:
        body["duration"] = config_value("--duration", parse.duration, args.duration, maximum=MAX_BAN)
    return _one(await api.call("POST", "/v1/bans", body=body, fields=BAN_FIELDS))


async def bans_delete(api: AdminApi, args: Any) -> Shown:
    await api.call("DELETE", f"/v1/bans/{segment(args.id)}", what=("MACHINE_ID", args.id))
    return Shown({"machine_id": args.id, "deleted": True}, f"ban of machine {args.id} lifted")


Handler = Callable[[AdminApi, Any], Any]
HANDLERS: dict[tuple[str, str], Handler] = {
    ("tokens", "list"): tokens_list, ("tokens", "show"): tokens_show, ("tokens", "create"): tokens_create,
    ("tokens", "delete"): tokens_delete,
    ("nodes", "list"): nodes_list, ("nodes", "show"): nodes_show, ("nodes", "delete"): nodes_delete,
    ("gateways", "list"): gateways_list, ("gateways", "show"): gateways_show, ("gateways", "delete"): gateways_delete,
    ("provisions", "list"): provisions_list, ("provisions", "show"): provisions_show,
    ("provisions", "create"): provisions_create, ("provisions", "delete"): provisions_delete,
    ("bans", "list"): bans_list, ("bans", "show"): bans_show, ("bans", "create"): bans_create,
    ("bans", "delete"): bans_delete,
}
