"""The provisioning loop: select, rent, boot, watch the node join; destroy what nobody uses.

This module is its scheduler: which provision is worked on when, by whom, and what wakes it. The
steps of each state are :mod:`.steps`, the watch on ready provisions :mod:`.ready`, the reconciler
(the providers' rentals against the provisions) :mod:`.reconciler`, and the state moves they share
:mod:`.transitions`.

:class:`Provisioner` runs as one coordinator background task (``provisioning``) owning a
``TaskGroup``: the scheduler, the reconciler (``provisioning-reconciler``), and one named task per
provision being worked on (``provision-<id>``). Every step starts from the provision's row
(:mod:`.store`), so a restarted coordinator resumes where the last one stopped; a provision is
driven by one coordinator at a time (a lease in its row).

* At start: the cluster's id is read (the rentals' labels carry it) and the providers are
  reconciled once, before the first scheduling pass.
* Every pass (every ``poll_interval`` s, or at once when woken): a provision in ``selecting``,
  ``renting``, ``booting`` or ``deleting`` whose ``next_try_at`` has come, and whose lease no other
  live coordinator holds, is claimed (:func:`.store.claim`) and gets its task; the task renews the
  lease at half its length, runs :meth:`.steps.Steps.step` until a step returns None (nothing left
  to do), sleeps between steps as long as the step said (or until woken), and releases the lease
  when it ends. Each pass refreshes the cost snapshot ``/metrics`` renders (:mod:`.costs`: a scrape
  reads no database), and every :data:`NODE_CHECK_INTERVAL` s looks at the nodes of ready
  provisions (:mod:`.ready`).
* Wake-ups: :meth:`Provisioner.kick` (a route changed a provision; a change of provisions or of
  gateways on the change feed, :meth:`Provisioner.on_change`; a machine given up) wakes the
  scheduler and every provision task waiting between steps.
* A step that raises :class:`~anex_agent.providers.rentals.ProviderUnavailable` (or anything
  unexpected: logged with its traceback) ends the task; the provision is tried again after its
  next retry delay (:class:`RetryDelays`, written to ``next_try_at``). These delays are the
  project's one :class:`anex_agent.backoff.Backoff` per provision, with its jitter (a random delay
  in ``[d/2, d]`` for ``d = ANEX_PROVISION_BACKOFF × 2^n`` capped at 60 s; a provider's
  ``Retry-After`` is a floor), so provisions that failed together do not come back together; they
  start over once the provision moves on (a state change, a rental recorded). They are not the
  recovery policy's retries (:mod:`.policy`), which start another attempt or round.
  :class:`~anex_agent.providers.rentals.KeyRefused`: :meth:`.steps.Steps.key_refused` says what
  then (failed, or a slow retry while deleting).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from anex_agent.backoff import Backoff
from anex_agent.coordinator import changes, credentials
from anex_agent.coordinator.provisioning import boot, costs, store
from anex_agent.coordinator.provisioning.config import ProvisioningSettings
from anex_agent.wire.provisioning import ProvisionState as S
from anex_agent.coordinator.provisioning.ready import ReadyChecks
from anex_agent.coordinator.provisioning.reconciler import Reconciler
from anex_agent.coordinator.provisioning.selector import Selector
from anex_agent.coordinator.provisioning.steps import Steps
from anex_agent.coordinator.provisioning.transitions import Transitions
from anex_agent.providers.rentals import KeyRefused, ProviderUnavailable, RentalProvider

if TYPE_CHECKING:
    import random

    from anex_agent.coordinator.context import Coordinator

log = logging.getLogger(__name__)

NODE_CHECK_INTERVAL = 2.0  # seconds between looks at the nodes of ready provisions
ACTIVE = (S.selecting.value, S.renting.value, S.booting.value, S.deleting.value)


class RetryDelays:
    """Per provision, how long to wait before trying a failed step again: one :class:`Backoff` each
    (base ``base``, doubling, capped at ``cap``, equal jitter), started over by :meth:`reset`."""

    def __init__(self, base: float, cap: float, rng: random.Random | None = None) -> None:
        self.base = base
        self.cap = cap
        self.rng = rng  # None: each Backoff draws from a fresh generator
        self._backoffs: dict[str, Backoff] = {}  # provision -> its provider failures in a row

    def next(self, pid: str, retry_after: float | None = None) -> float:
        """The delay before the next try of ``pid`` (never below ``retry_after``, the provider's ``Retry-After``)."""
        backoff = self._backoffs.get(pid)
        if backoff is None:
            backoff = self._backoffs[pid] = Backoff(base=self.base, cap=self.cap, rng=self.rng)
        return max(backoff.next_delay(), retry_after or 0.0)

    def reset(self, pid: str) -> None:
        """``pid`` moved on: its next failure waits the shortest delay again."""
        self._backoffs.pop(pid, None)


class Provisioner:
    """The provisioning loop of one coordinator process: :meth:`run` is its background task."""

    def __init__(self, ctx: Coordinator, *, providers: Mapping[str, RentalProvider], selector: Selector,
                 issuer: boot.BootIssuer, settings: ProvisioningSettings, bans: Any = None,
                 ban_seconds: float = 3600.0) -> None:
        self.ctx = ctx
        self.settings = settings
        self.owner = credentials.new_id("w")  # this process, for leases
        self._kick = asyncio.Event()
        self._running: dict[str, asyncio.Task] = {}
        self.retry_delays = RetryDelays(settings.backoff, settings.backoff_max)
        self.transitions = Transitions(
            ctx, providers=providers, settings=settings, bans=bans, ban_seconds=ban_seconds,
            progressed=self.retry_delays.reset, forget=lambda rental_id: self.reconciler.forget(rental_id),
            wake=self.kick)
        self.steps = Steps(ctx, self.transitions, selector=selector, issuer=issuer, settings=settings)
        self.ready = ReadyChecks(ctx, self.transitions)
        self.reconciler = Reconciler(ctx, self.transitions, settings)
        self.metrics_rows: list[dict] = []  # cost snapshot for /metrics (refreshed by the scheduler)
        self.started = asyncio.Event()
        self._nodes_checked_at = 0.0

    def kick(self) -> None:
        """Wake the scheduler and every waiting provision task (a change may concern them)."""
        self._kick.set()
        self._kick = asyncio.Event()

    def on_change(self, change: changes.Change) -> None:
        if change.scope in (changes.Scope.ALL_GATEWAYS, changes.Scope.PROVISIONS):
            self.kick()

    async def _sleep(self, seconds: float) -> None:
        event = self._kick
        try:
            async with asyncio.timeout(max(0.0, seconds)):
                await event.wait()
        except TimeoutError:
            pass

    async def run(self) -> None:
        self.transitions.cluster_id = await store.cluster_id(self.ctx.db)
        try:
            await self.reconcile()
        except Exception:
            log.exception("provisioning: the first reconciliation failed; retrying on schedule")
        self.started.set()
        async with asyncio.TaskGroup() as group:
            group.create_task(self.reconciler.run(), name="provisioning-reconciler")
            while True:
                try:
                    await self._schedule(group)
                except Exception:
                    log.exception("provisioning: scheduling failed; retrying")
                await self._sleep(self.settings.poll_interval)

    async def _schedule(self, group: asyncio.TaskGroup) -> None:
        now = self.ctx.clock()
        rows = await self.ctx.db.fetch(
            f"SELECT id, next_try_at, lease_owner, lease_until FROM provisions WHERE state IN "
            f"({', '.join(repr(s) for s in ACTIVE)})")
        for row in rows:
            pid = row["id"]
            if pid in self._running or row["next_try_at"] > now:
                continue
            if row["lease_owner"] not in (None, self.owner) and row["lease_until"] >= now:
                continue
            if not await store.claim(self.ctx.db, pid, self.owner, now=now, lease=self.settings.lease):
                continue
            task = group.create_task(self._drive(pid), name=f"provision-{pid}")
            self._running[pid] = task
            task.add_done_callback(lambda _t, pid=pid: self._running.pop(pid, None))
        await self._refresh_metrics(now)
        if now >= self._nodes_checked_at + NODE_CHECK_INTERVAL:
            self._nodes_checked_at = now
            await self.check_ready_nodes()

    async def _drive(self, pid: str) -> None:
        """Work on one provision until it needs nothing (ready, failed, lost, deleted) or waits for a retry."""
        lease_until = self.ctx.clock() + self.settings.lease
        try:
            while True:
                now = self.ctx.clock()
                if lease_until - now < self.settings.lease / 2:
                    if not await store.claim(self.ctx.db, pid, self.owner, now=now, lease=self.settings.lease):
                        return
                    lease_until = now + self.settings.lease
                try:
                    delay = await self.steps.step(pid)
                except KeyRefused as err:
                    delay = await self.steps.key_refused(pid, err)
                    if delay is None:
                        return
                    await self._retry_at(pid, delay)
                    return
                except ProviderUnavailable as err:
                    delay = self.retry_delays.next(pid, err.retry_after)
                    log.warning("provision %s: %s; retrying in %.0fs", pid, err, delay)
                    await self._retry_at(pid, delay)
                    return
                except Exception:
                    delay = self.retry_delays.next(pid)
                    log.exception("provision %s: step failed; retrying in %.0fs", pid, delay)
                    await self._retry_at(pid, delay)
                    return
                if delay is None:
                    return
                if delay > 0:
                    await self._sleep(delay)
        finally:
            await store.release(self.ctx.db, pid, self.owner)

    async def _retry_at(self, pid: str, delay: float) -> None:
        await self.ctx.db.execute("UPDATE provisions SET next_try_at = $2 WHERE id = $1", pid,
                                  self.ctx.clock() + delay)

    async def reconcile(self) -> None:
        """Reconcile the providers' rentals with the provisions now (:meth:`.reconciler.Reconciler.reconcile`)."""
        await self.reconciler.reconcile()

    async def check_ready_nodes(self) -> None:
        """Look at the node of every ready provision now (:meth:`.ready.ReadyChecks.check`)."""
        await self.ready.check()

    async def _refresh_metrics(self, now: float) -> None:
        self.metrics_rows = await self.ctx.db.fetch(costs.ROWS_SQL)

    def render_metrics(self) -> bytes:
        """The cost series, from the snapshot the scheduler keeps (no database call on a scrape)."""
        return costs.render(self.metrics_rows, self.ctx.clock())
