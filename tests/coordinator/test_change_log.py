"""The change log's names: a scope says who is told, a type says what changed, and only
the pairs :data:`changes.KINDS` lists are ever written."""

from __future__ import annotations

import pytest

from anex_agent.coordinator import changes
from anex_agent.coordinator import db as dbmod
from anex_agent.coordinator.changes import Change, ChangeType, Scope, Subscription
from anex_agent.coordinator.migrations import CORE, apply


@pytest.fixture
async def db(database_url):
    database = await dbmod.open_database(database_url)
    try:
        await apply(database, CORE, clock=lambda: 0.0)
        yield database
    finally:
        await database.close()


@pytest.mark.parametrize(
    ("scope", "type_", "target"),
    [
        (Scope.ALL_NODES, ChangeType.PEER_ADDED, None),  # nodes are never told of peers
        (Scope.ALL_GATEWAYS, ChangeType.CONFIG, None),
        (Scope.ONE_GATEWAY, ChangeType.CONFIG, "g1"),  # a gateway has no config change
        (Scope.ONE_NODE, ChangeType.CONFIG, None),  # a targeted scope names its target
        (Scope.CREDENTIAL_CACHES, ChangeType.ROTATED, None),
        (Scope.RESYNC, ChangeType.RESYNC, None),  # never stored
    ],
)
async def test_append_refuses_a_kind_its_scope_does_not_carry(db, scope, type_, target):
    async with db.transaction() as tx:
        before = await changes.current_version(tx)
        with pytest.raises(ValueError, match="change log"):
            await changes.append(db, tx, scope, type_, target=target, now=1.0)
        assert await changes.current_version(tx) == before


async def test_rows_come_back_typed_with_the_stored_values_unchanged(db):
    async with db.transaction() as tx:
        version = await changes.append(db, tx, Scope.ONE_NODE, ChangeType.CONFIG, target="n1", now=1.0)
    row = await db.fetchrow("SELECT version, scope, target, type, payload FROM changes WHERE version = $1", version)
    assert (row["scope"], row["type"]) == ("node", "config")  # what older coordinators wrote and read
    change = Change.from_row(row)
    assert change.scope is Scope.ONE_NODE and change.type is ChangeType.CONFIG and change.target == "n1"


def _told(change: Change) -> set[str]:
    subs = [Subscription("node", "n1"), Subscription("node", "n2"), Subscription("gateway", "g1"),
            Subscription("gateway", "g2")]
    return {f"{s.kind}:{s.ident}" for s in subs if changes._tells(change, s)}


def test_the_scope_names_who_is_told():
    assert _told(Change(1, Scope.ALL_GATEWAYS, "n1", ChangeType.PEER_ADDED, {})) == {"gateway:g1", "gateway:g2"}
    assert _told(Change(2, Scope.ONE_GATEWAY, "g1", ChangeType.DELETED, {})) == {"gateway:g1"}
    assert _told(Change(3, Scope.ALL_NODES, None, ChangeType.GATEWAY_CHANGED, {})) == {"node:n1", "node:n2"}
    assert _told(Change(4, Scope.ONE_NODE, "n2", ChangeType.CONFIG, {})) == {"node:n2"}
    assert _told(Change(5, Scope.CREDENTIAL_CACHES, "n1", ChangeType.ROTATED, {})) == set()
    assert _told(Change.resync(6)) == {"node:n1", "node:n2", "gateway:g1", "gateway:g2"}


def test_every_scope_lists_its_kinds():
    assert set(changes.KINDS) == set(Scope)
    assert set().union(*changes.KINDS.values()) == set(ChangeType)
