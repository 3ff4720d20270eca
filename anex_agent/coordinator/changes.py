"""The change log and its per-process feed.

Every change a watcher may care about is a row of ``changes`` written in the same
transaction as the change itself (:func:`append`). Versions come from the
``counters`` row ``version``, incremented with ``UPDATE .. RETURNING``: the row lock
is held until commit, so versions become visible strictly in order, also with
several coordinator processes on one PostgreSQL (a reader that has seen version N
has seen every version below N).

A change's :class:`Scope` says who is told; its :class:`ChangeType` says what changed
(:data:`KINDS` lists the types each scope carries; :func:`append` refuses any other):

* :attr:`Scope.ALL_GATEWAYS` (every gateway is told): ``peer_added`` / ``peer_removed``,
  payload a :class:`wire.MeshPeer`;
* :attr:`Scope.ONE_NODE` (the node ``target`` is told): ``config`` (its config changed),
  ``labels`` (an admin changed its labels; the node gets its config again),
  ``deleted`` or ``rejoined`` (its credential was replaced: watchers with the old one are closed),
  ``ssh_revoked`` (an SSH user certificate for it was revoked; payload ``serial``, ``valid_before``);
* :attr:`Scope.ONE_GATEWAY` (the gateway ``target`` is told): ``deleted`` or ``rejoined``;
* :attr:`Scope.ALL_NODES` (every node is told): ``gateway_changed`` (the gateway set
  changed: every node's config changed);
* :attr:`Scope.CREDENTIAL_CACHES` (no watcher is told, only the credential caches):
  ``rotated`` / ``grace_ended`` for the node or gateway ``target``;
* :attr:`Scope.PROVISIONS` (admin watchers of ``/v1/provisions/watch``): ``provision`` (the
  provision ``target`` changed state; payload ``{"id", "state"}``);
* :attr:`Scope.RESYNC` (never stored; everybody is told): the feed found changes pruned
  before it read them (a long outage); listeners drop their caches and every watcher is
  sent back for a snapshot.

The stored values (``gateways``, ``node``, ...) are the database's and do not change.

:class:`ChangeFeed` tails the log in each process: woken at once by local commits
(:meth:`ChangeFeed.poke`) and by PostgreSQL ``NOTIFY anex_changes`` from other
processes, and by polling every ``poll_interval`` as a fallback. It hands each change,
in version order, to every subscriber queue and to every listener callback.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from anex_agent.coordinator.db import Conn, Database

log = logging.getLogger(__name__)

CHANNEL = "anex_changes"
RELISTEN_INTERVAL = 5.0  # seconds between attempts to re-open a lost NOTIFY connection


class Scope(StrEnum):
    """Who is told of a change (the value is what the ``changes.scope`` column stores)."""

    ALL_GATEWAYS = "gateways"  # every gateway: the mesh's node peers changed
    ONE_GATEWAY = "gateway"  # the gateway named by ``target``
    ALL_NODES = "nodes"  # every node: the gateway set changed
    ONE_NODE = "node"  # the node named by ``target``
    CREDENTIAL_CACHES = "credentials"  # no watcher: a credential of ``target`` rotated
    PROVISIONS = "provisions"  # admin watchers of provisions: the provision ``target`` changed
    RESYNC = "resync"  # not in the log: the feed skipped pruned changes; caches and watchers start over


class ChangeType(StrEnum):
    """What changed (the value is what the ``changes.type`` column stores)."""

    PEER_ADDED = "peer_added"
    PEER_REMOVED = "peer_removed"
    CONFIG = "config"
    LABELS = "labels"
    GATEWAY_CHANGED = "gateway_changed"
    DELETED = "deleted"
    REJOINED = "rejoined"
    ROTATED = "rotated"
    GRACE_ENDED = "grace_ended"
    PROVISION = "provision"
    SSH_REVOKED = "ssh_revoked"
    RESYNC = "resync"


KINDS: dict[Scope, frozenset[ChangeType]] = {
    Scope.ALL_GATEWAYS: frozenset({ChangeType.PEER_ADDED, ChangeType.PEER_REMOVED}),
    Scope.ONE_GATEWAY: frozenset({ChangeType.DELETED, ChangeType.REJOINED}),
    Scope.ALL_NODES: frozenset({ChangeType.GATEWAY_CHANGED}),
    Scope.ONE_NODE: frozenset({ChangeType.CONFIG, ChangeType.LABELS, ChangeType.DELETED, ChangeType.REJOINED,
                               ChangeType.SSH_REVOKED}),
    Scope.CREDENTIAL_CACHES: frozenset({ChangeType.ROTATED, ChangeType.GRACE_ENDED}),
    Scope.PROVISIONS: frozenset({ChangeType.PROVISION}),
    Scope.RESYNC: frozenset({ChangeType.RESYNC}),
}
REVOKING = frozenset({ChangeType.DELETED, ChangeType.REJOINED})  # the target's credential is gone
TARGETED = frozenset({Scope.ONE_GATEWAY, Scope.ONE_NODE, Scope.CREDENTIAL_CACHES, Scope.PROVISIONS})  # these name their ``target``


@dataclass(frozen=True)
class Change:
    version: int
    scope: Scope
    target: str | None
    type: ChangeType
    payload: dict[str, Any]

    @classmethod
    def from_row(cls, row: dict) -> Change:
        return cls(row["version"], Scope(row["scope"]), row["target"], ChangeType(row["type"]),
                   json.loads(row["payload"]))

    @classmethod
    def resync(cls, version: int) -> Change:
        return cls(version, Scope.RESYNC, None, ChangeType.RESYNC, {})


async def append(
    db: Database,
    tx: Conn,
    scope: Scope,
    type_: ChangeType,
    *,
    target: str | None = None,
    payload: dict | None = None,
    now: float,
) -> int:
    """Record a change inside ``tx``; return its version.

    Raises ``ValueError`` (a programming error) for a type its scope does not carry, a
    targeted scope without ``target``, or :attr:`Scope.RESYNC` (never stored)."""
    if scope is Scope.RESYNC or type_ not in KINDS[scope]:
        raise ValueError(f"change log: a {scope.value!r} change cannot be {type_.value!r}")
    if scope in TARGETED and not target:
        raise ValueError(f"change log: a {scope.value!r} change names its target")
    version = await tx.fetchval("UPDATE counters SET value = value + 1 WHERE name = 'version' RETURNING value")
    await tx.execute(
        "INSERT INTO changes (version, scope, target, type, payload, created_at) VALUES ($1, $2, $3, $4, $5, $6)",
        version,
        scope.value,
        target,
        type_.value,
        json.dumps(payload or {}),
        now,
    )
    await db.notify(tx, CHANNEL, str(version))
    return int(version)


async def current_version(db: Database | Conn) -> int:
    return int(await db.fetchval("SELECT value FROM counters WHERE name = 'version'"))


async def pruned_through(db: Database | Conn) -> int:
    return int(await db.fetchval("SELECT value FROM counters WHERE name = 'pruned_through'"))


async def prune(db: Database, *, keep: int) -> int:
    """Delete all but the newest ``keep`` changes; return the new ``pruned_through`` version."""
    async with db.transaction() as tx:
        newest = await current_version(tx)
        cutoff = newest - keep
        if cutoff <= await pruned_through(tx):
            return await pruned_through(tx)
        await tx.execute("DELETE FROM changes WHERE version <= $1", cutoff)
        await tx.execute("UPDATE counters SET value = $1 WHERE name = 'pruned_through'", cutoff)
        return cutoff


@dataclass(eq=False)
class Subscription:
    """A watcher's queue. ``kind`` is ``node`` or ``gateway``; ``ident`` its id.

    The queue is bounded: when it is full (the watcher does not keep up), it is emptied
    and holds one ``resync`` change from then on; the watcher starts over from a snapshot.
    """

    kind: str
    ident: str
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    overflowed: bool = False

    def offer(self, change: Change) -> None:
        if self.overflowed:
            return
        try:
            self.queue.put_nowait(change)
        except asyncio.QueueFull:
            self.overflowed = True
            while not self.queue.empty():
                self.queue.get_nowait()
            self.queue.put_nowait(Change.resync(change.version))


class ChangeFeed:
    """Tails ``changes`` and fans each change out, in order, within this process."""

    def __init__(self, db: Database, *, poll_interval: float = 0.5, queue_size: int = 0) -> None:
        self._db = db
        self._queue_size = queue_size  # per subscriber; 0: unbounded
        self._poll_interval = poll_interval
        self._wake = asyncio.Event()
        self._subscriptions: set[Subscription] = set()
        self._listeners: list[Callable[[Change], None]] = []
        self.version = 0
        self._notify = False
        self._next_listen_attempt = 0.0

    async def start(self) -> None:
        """Start at the current head; subscribe to NOTIFY where the database has it."""
        self.version = await current_version(self._db)
        self._notify = await self._db.listen(CHANNEL, lambda _payload: self._wake.set())

    async def _relisten(self) -> None:
        """The NOTIFY connection died (database restart): polling goes on; try to listen again."""
        now = asyncio.get_running_loop().time()
        if now < self._next_listen_attempt:
            return
        self._next_listen_attempt = now + RELISTEN_INTERVAL
        try:
            await self._db.listen(CHANNEL, lambda _payload: self._wake.set())
            log.info("change feed: listening for notifications again")
            self._wake.set()
        except Exception as err:
            log.warning("change feed: cannot listen for notifications (%s); polling every %.1fs", err,
                        self._poll_interval)

    def poke(self) -> None:
        """Call after committing a change in this process: deliver it now."""
        self._wake.set()

    def add_listener(self, callback: Callable[[Change], None]) -> None:
        """``callback(change)`` runs for every change, before subscribers see it (cache upkeep)."""
        self._listeners.append(callback)

    def subscribe(self, kind: str, ident: str) -> Subscription:
        sub = Subscription(kind, ident, asyncio.Queue(self._queue_size))
        self._subscriptions.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subscriptions.discard(sub)

    @property
    def watcher_count(self) -> int:
        return len(self._subscriptions)

    async def run(self) -> None:
        """Forever: wait for a poke, a NOTIFY or the poll interval, then deliver new changes."""
        while True:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can lose a cancellation
            # that races with its own timeout, and the coordinator then never stops
            try:
                async with asyncio.timeout(self._poll_interval):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            if self._notify and not self._db.listening():
                await self._relisten()
            try:
                await self.catch_up()
            except Exception:  # the database may be briefly away: keep tailing
                log.exception("change feed: reading the change log failed; retrying")
                await asyncio.sleep(self._poll_interval)

    async def catch_up(self) -> None:
        while True:
            rows = await self._db.fetch(
                "SELECT version, scope, target, type, payload FROM changes WHERE version > $1 ORDER BY version LIMIT 500",
                self.version,
            )
            if not rows or rows[0]["version"] > self.version + 1:  # versions are dense: a gap was pruned
                pruned = await pruned_through(self._db)
                if pruned > self.version:  # pruned past us (long outage): jump; everyone resyncs
                    log.warning("change feed: versions %d..%d were pruned before this process read them; "
                                "watchers resync", self.version + 1, pruned)
                    self._deliver(Change.resync(pruned))
            if not rows:
                return
            for row in rows:
                self._deliver(Change.from_row(row))

    def _deliver(self, change: Change) -> None:
        self.version = change.version
        for callback in self._listeners:
            try:
                callback(change)
            except Exception:
                log.exception("change feed listener failed on version %d", change.version)
        for sub in list(self._subscriptions):
            if _tells(change, sub):
                sub.offer(change)


def _tells(change: Change, sub: Subscription) -> bool:
    """Whether the watcher behind ``sub`` is told of ``change``."""
    if change.scope == Scope.RESYNC:
        return True
    if sub.kind == "gateway":
        return change.scope == Scope.ALL_GATEWAYS or (change.scope == Scope.ONE_GATEWAY and change.target == sub.ident)
    if sub.kind == "node":
        return change.scope == Scope.ALL_NODES or (change.scope == Scope.ONE_NODE and change.target == sub.ident)
    if sub.kind == "provisions":
        return change.scope == Scope.PROVISIONS
    return False
