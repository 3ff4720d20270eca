"""Node labels after join: an administrator sets and removes them (on-prem nodes are steered
this way: ``busy``, ``maintenance``, ``price-per-hour``, ``country``, ``qualification``, and
free-form labels; see :mod:`anex_agent.selection.labels`).

    PATCH  /v1/nodes/{node_id}/labels         admin  NodeLabelsUpdate -> NodeLabels
    DELETE /v1/nodes/{node_id}/labels/{key}   admin  -> 204 (404 when the node or the label is absent)

Every update is one transaction: the node's labels are rewritten and a ``node`` scoped
``labels`` change (payload ``{"labels": {...}}``, the full new set) is appended to the change
log, so the node's watch stream sees it (as a ``config`` event carrying the node's config,
whose version becomes the change's) and every coordinator process's feed listeners do too. Updates of one node are
serialized (the node row is locked first), so two concurrent updates never lose one another.
Bad labels answer 422 ``application/problem+json`` with one ``errors`` entry per label
(``field`` = ``set.<key>`` or ``remove``).
"""

from __future__ import annotations

import json

from anex_agent.coordinator import changes, problems
from anex_agent.coordinator.auth import Auth
from anex_agent.coordinator.routes.registry import Call, Route, RouteRegistry
from anex_agent.selection import labels
from anex_agent.selection.models import NodeLabels, NodeLabelsUpdate

LABELS_CHANGE = changes.ChangeType.LABELS


def _invalid(errors: list[dict[str, str]]) -> problems.Problem:
    fields = ", ".join(dict.fromkeys(e["field"] for e in errors))
    return problems.Problem(422, "Unprocessable Content", f"invalid labels: check {fields}", slug="validation",
                            errors=errors)


def checked(update: NodeLabelsUpdate) -> tuple[dict[str, str], list[str]]:
    """The normalized labels to set and the keys to remove; raises a 422 problem naming each bad one."""
    errors: list[dict[str, str]] = []
    to_set: dict[str, str] = {}
    for key, value in update.set.items():
        try:
            to_set[key] = labels.normalize(key, value)
        except ValueError as err:
            errors.append({"field": f"set.{key}", "message": str(err)})
    for key in update.remove:
        try:
            labels.check_key(key)
        except ValueError as err:
            errors.append({"field": "remove", "message": str(err)})
        if key in update.set:
            errors.append({"field": f"set.{key}", "message": f"{key!r} is both set and removed; do one"})
    if errors:
        raise _invalid(errors)
    return to_set, list(dict.fromkeys(update.remove))


async def update_labels(ctx, node_id: str, to_set: dict[str, str], remove: list[str], *,
                        must_exist: str | None = None) -> NodeLabels:
    """Apply one update to ``node_id``'s labels and record it in the change log (one transaction).

    ``must_exist``: a key that must be present (404 otherwise), for a single-label delete.
    """
    now = ctx.clock()
    async with ctx.db.transaction() as tx:
        # lock the node's row first (PostgreSQL: row lock; SQLite: the write lock), so the read
        # below sees every update committed before ours
        if not await tx.execute("UPDATE nodes SET labels = labels WHERE id = $1", node_id):
            raise problems.not_found(f"node {node_id}")
        current = json.loads(await tx.fetchval("SELECT labels FROM nodes WHERE id = $1", node_id) or "{}")
        if must_exist is not None and must_exist not in current:
            raise problems.not_found(f"label {must_exist!r} of node {node_id}")
        merged = {k: v for k, v in current.items() if k not in remove}
        merged.update(to_set)
        if len(merged) > labels.MAX_LABELS:
            raise _invalid([{"field": "set", "message": f"a node may carry at most {labels.MAX_LABELS} labels; "
                                                        f"this update leaves {len(merged)}"}])
        version = await changes.append(ctx.db, tx, changes.Scope.ONE_NODE, LABELS_CHANGE, target=node_id,
                                       payload={"labels": merged}, now=now)
        # the node's stream carried this version (as a config event): a resume from it replays nothing
        await tx.execute("UPDATE nodes SET labels = $2, config_version = $3 WHERE id = $1", node_id,
                         json.dumps(merged, sort_keys=True), version)
    ctx.committed()
    return NodeLabels(node_id=node_id, labels=merged, version=version)


async def patch_labels(call: Call) -> NodeLabels:
    to_set, remove = checked(call.body)
    return await update_labels(call.ctx, call.param("node_id"), to_set, remove)


async def delete_label(call: Call) -> None:
    key = call.param("key")
    await update_labels(call.ctx, call.param("node_id"), {}, [key], must_exist=key)
    return None


def setup(registry: RouteRegistry, ctx) -> None:
    tags = ("nodes",)
    registry.add(Route("PATCH", "/v1/nodes/{node_id}/labels", patch_labels, Auth.admin,
                       "Set and remove a node's labels (busy, maintenance, price-per-hour, country, qualification, "
                       "free-form); the change reaches the node's watch stream",
                       request_model=NodeLabelsUpdate, response_model=NodeLabels, tags=tags, problems=(404, 422)))
    registry.add(Route("DELETE", "/v1/nodes/{node_id}/labels/{key}", delete_label, Auth.admin,
                       "Remove one label of a node", status=204, tags=tags, problems=(404,)))
