"""The change log and its per-process feed.

Every change a watcher may care about is a row of ``changes`` written in the same
transaction as the change itself (:func:`append`). Versions come from the
``counters`` row ``version``, incremented with ``UPDATE .. RETURNING``: the row lock
is held until commit, so versions become visible strictly in order, also with
several coordinator processes on one PostgreSQL (a reader that has seen version N
has seen every version below N).

Scopes and types:
* ``gateways``: ``peer_added`` / ``peer_removed``, payload a :class:`wire.MeshPeer`;
* ``node`` (target = node id): ``config`` (its config changed), ``deleted`` or
  ``rejoined`` (its credential was replaced: watchers with the old one are closed);
* ``gateway`` (target = gateway id): ``deleted`` or ``rejoined``;
* ``nodes``: ``gateway_changed`` (the gateway set changed: every node's config changed).
* ``resync`` (never stored): the feed found changes pruned before it read them (a long
  outage); listeners drop their caches and every watcher is sent back for a snapshot.

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
from typing import Any

from anex_agent.coordinator.db import Conn, Database

log = logging.getLogger(__name__)

CHANNEL = "anex_changes"
RELISTEN_INTERVAL = 5.0  # seconds between attempts to re-open a lost NOTIFY connection
GATEWAYS = "gateways"
GATEWAY = "gateway"
NODE = "node"
NODES = "nodes"
CREDENTIALS = "credentials"  # a node's or gateway's credential rotated (target: its id); no watcher gets it
RESYNC = "resync"  # not in the log: the feed skipped pruned changes; caches and watchers start over


@dataclass(frozen=True)
class Change:
    version: int
    scope: str
    target: str | None
    type: str
    payload: dict[str, Any]

    @classmethod
    def from_row(cls, row: dict) -> Change:
        return cls(row["version"], row["scope"], row["target"], row["type"], json.loads(row["payload"]))


async def append(
    db: Database, tx: Conn, scope: str, type_: str, *, target: str | None = None, payload: dict | None = None, now: float
) -> int:
    """Record a change inside ``tx``; return its version."""
    version = await tx.fetchval("UPDATE counters SET value = value + 1 WHERE name = 'version' RETURNING value")
    await tx.execute(
        "INSERT INTO changes (version, scope, target, type, payload, created_at) VALUES ($1, $2, $3, $4, $5, $6)",
        version,
        scope,
        target,
        type_,
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
            self.queue.put_nowait(Change(change.version, RESYNC, None, RESYNC, {}))


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
                    self._deliver(Change(pruned, RESYNC, None, RESYNC, {}))
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
            if change.scope == RESYNC:
                sub.offer(change)
            elif sub.kind == "gateway" and (
                change.scope == GATEWAYS or (change.scope == GATEWAY and change.target == sub.ident)
            ):
                sub.offer(change)
            elif sub.kind == "node" and (change.scope == NODES or (change.scope == NODE and change.target == sub.ident)):
                sub.offer(change)
