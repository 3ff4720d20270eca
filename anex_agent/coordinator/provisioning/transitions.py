"""A provision's state moves, and what goes with them, shared by the provisioning loop's steps
(:mod:`.steps`), its ready checks (:mod:`.ready`) and its reconciler (:mod:`.reconciler`).

:class:`Transitions` (one per :class:`~.scheduler.Provisioner`) holds the providers, the settings and
the cluster's id (set by the scheduler when it starts: the rentals' labels carry it):

* :meth:`Transitions.transition` moves a provision from the state(s) expected to another in one
  transaction, ending the attempt given in it (outcome, reason, and the event that outcome is:
  :func:`.recovery.event_of`); False when the state moved meanwhile (a DELETE). Every move (and a
  rental recorded) calls ``progressed``: the scheduler's retry delays of the provision start over.
* :meth:`Transitions.end_or_retry`: a round of attempts ended, or the machine was lost: the recovery
  policy (:func:`.recovery.decide`) sends the provision back to ``selecting`` after its backoff when
  it retries on the event within its window, else to the final state with the reason.
* :meth:`Transitions.lose`: the machine is gone or given up: the attempt ends, the policy decides,
  the node is removed, the rental destroyed (``destroy``; a provider that cannot answer leaves it to
  the reconciler), a Vast.AI machine banned (``ban``); ``forget`` drops the reconciler's count of the
  rental and ``wake`` wakes the scheduler.
* Rentals and nodes: :meth:`Transitions.find_rental` (the provision's rental, by its label),
  :meth:`Transitions.release_rental` (destroy the attempt's rental; an unknown rent outcome is
  settled by listing; raises ProviderUnavailable when the provider could not tell),
  :meth:`Transitions.remove_node`, :meth:`Transitions.ban`.
* :meth:`Transitions.policy_of`: the provision's recovery policy (:mod:`.policy`), parsed once per
  provision body (at most :data:`POLICY_CACHE` kept).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from anex_agent.coordinator import nodes, problems
from anex_agent.coordinator.provisioning import boot, recovery, store
from anex_agent.coordinator.provisioning.config import ProvisioningSettings
from anex_agent.wire.provisioning import ProvisionState as S
from anex_agent.coordinator.provisioning.policy import INTERRUPTION, RecoveryPolicy, parse_policy
from anex_agent.providers.rentals import (
    ProviderUnavailable, Rental, RentalProvider, cluster_label_prefix, rental_label,
)
from anex_agent.selection.annotations import AnnotationError

if TYPE_CHECKING:
    from anex_agent.coordinator.context import Coordinator

log = logging.getLogger(__name__)

POLICY_CACHE = 4096  # parsed recovery policies kept (by provision body)


class Transitions:
    def __init__(self, ctx: Coordinator, *, providers: Mapping[str, RentalProvider], settings: ProvisioningSettings,
                 bans: Any = None, ban_seconds: float = 3600.0, progressed: Callable[[str], None] = lambda pid: None,
                 forget: Callable[[str], None] = lambda rental_id: None, wake: Callable[[], None] = lambda: None,
                 ) -> None:
        self.ctx = ctx
        self.providers = dict(providers)
        self.settings = settings
        self.bans = bans
        self.ban_seconds = ban_seconds
        self.progressed = progressed  # a provision moved on: its retry delays start over
        self.forget = forget  # a rental given up: the reconciler's count of it is dropped
        self.wake = wake  # wakes the scheduler and every waiting provision task
        self.cluster_id = ""
        self._policies: dict[str, RecoveryPolicy] = {}  # provision body (JSON) -> its recovery policy

    def policy_of(self, row: dict) -> RecoveryPolicy:
        """The provision's recovery policy: its annotations over the coordinator's defaults (parsed once per
        provision body)."""
        found = self._policies.get(row["spec"])
        if found is None:
            try:
                found = parse_policy(store.spec_of(row).annotations, self.settings.policy)
            except AnnotationError:  # checked at POST; not expected
                found = self.settings.policy
            if len(self._policies) >= POLICY_CACHE:
                self._policies.clear()
            self._policies[row["spec"]] = found
        return found

    async def transition(self, pid: str, expected: S | tuple[S, ...], state: S, *, reason: str | None = None,
                         end: tuple[int, str, str] | None = None, **columns: Any) -> bool:
        """Move ``pid`` from ``expected`` to ``state`` in one transaction (ending attempt ``end``
        = ``(number, outcome, reason)`` in it); False when the state moved meanwhile (a DELETE)."""
        expected_values = {s.value for s in (expected if isinstance(expected, tuple) else (expected,))}
        now = self.ctx.clock()
        async with self.ctx.db.transaction() as tx:
            current = await store.state_for_update(tx, pid)
            if current not in expected_values:
                return False
            if end is not None:
                await store.end_attempt(tx, pid, end[0], end[1], end[2], now=now)
                await tx.execute("UPDATE provision_attempts SET event = $3 WHERE provision_id = $1 AND number = $2"
                                 " AND event IS NULL", pid, end[0], recovery.event_of(end[1]))
            await store.set_state(self.ctx.db, tx, pid, state, now=now, reason=reason, **columns)
        self.progressed(pid)
        self.ctx.committed()
        return True

    async def end_or_retry(self, pid: str, expected: S | tuple[S, ...], final: S, event: str | None, reason: str,
                           *, end: tuple[int, str, str] | None = None, **columns: Any) -> bool:
        """A round of attempts ended, or the machine was lost: back to ``selecting`` after the policy's
        backoff when it retries on ``event`` within its window, else ``final`` with the reason."""
        row = await store.get(self.ctx.db, pid)
        if row is None:
            return False
        now = self.ctx.clock()
        decision = recovery.decide(self.policy_of(row), row, event, reason, now=now)
        if isinstance(decision, str):
            return await self.transition(pid, expected, final, reason=decision, end=end, **columns)
        log.warning("provision %s: %s", pid, decision.reason)
        return await self.transition(pid, expected, S.selecting, reason=decision.reason, end=end,
                                     retries=decision.retries, retry_since=decision.since,
                                     round_start=int(row["attempt"]), next_try_at=now + decision.delay,
                                     rent_tries=0, boot_deadline=None, **columns)

    async def lose(self, row: dict, provider: str, rental_id: str | None, reason: str, *,
                   destroy: bool = False, outcome: str = "lost", event: str | None = INTERRUPTION,
                   ban: bool = False, final: S = S.lost) -> None:
        """The machine is gone or given up: the attempt ends ``outcome`` with ``reason``, the provision
        goes ``final`` (``lost``), unless its policy retries on ``event``: back to ``selecting``. Its node is
        revoked; ``destroy``: its rental too (selecting destroys it before renting again, else the
        reconciler); ``ban``: a Vast.AI machine is banned."""
        pid = row["id"]
        expected = (S.ready,) if final is S.released else (S.booting, S.ready)
        if not await self.end_or_retry(pid, expected, final, event, reason,
                                       end=(int(row["number"]), outcome, reason)):
            return
        if rental_id is not None:
            self.forget(rental_id)
        log.warning("provision %s: %s: %s; revoking its node", pid, outcome, reason)
        if ban:
            await self.ban(row, reason)
        node = await boot.joined_node(self.ctx.db, pid)
        for node_id in {row["node_id"], node["id"] if node else None} - {None}:
            await self.remove_node(node_id)
        rental_provider = self.providers.get(provider)
        if destroy and rental_id is not None and rental_provider is not None:
            try:
                await rental_provider.destroy(rental_id)
                log.info("provision %s: destroyed %s rental %s", pid, provider, rental_id)
            except ProviderUnavailable as err:
                log.warning("provision %s: cannot destroy %s rental %s now (%s); the reconciler will", pid,
                            provider, rental_id, err)
        self.wake()

    async def find_rental(self, provider: RentalProvider, pid: str) -> Rental | None:
        label = rental_label(self.cluster_id, pid)
        for rental in await provider.list_rentals(cluster_label_prefix(self.cluster_id)):
            if rental.label == label:
                return rental
        return None

    async def release_rental(self, pid: str, attempt: dict | None) -> None:
        """Destroy the attempt's rental (raises ProviderUnavailable when the provider could not tell)."""
        if attempt is None or attempt["ended_at"] is not None:
            return
        provider = self.providers.get(attempt["provider"])
        if provider is None:
            return
        rental_id = attempt["rental_id"]
        if rental_id is None:
            row = await store.get(self.ctx.db, pid)
            if row is None or not row["rent_tries"]:
                return  # never asked to rent
            found = await self.find_rental(provider, pid)
            if found is None:
                return
            rental_id = found.rental_id
            await self.ctx.db.execute("UPDATE provision_attempts SET rental_id = $3, rented_at = COALESCE(rented_at, $4)"
                                      " WHERE provision_id = $1 AND number = $2", pid, attempt["number"], rental_id,
                                      self.ctx.clock())
        await provider.destroy(rental_id)
        log.info("provision %s: destroyed %s rental %s", pid, provider.name, rental_id)

    async def remove_node(self, node_id: str) -> None:
        try:
            await nodes.delete(self.ctx, node_id)
        except problems.Problem:  # already gone
            pass

    async def ban(self, attempt: dict | None, reason: str) -> None:
        if attempt is not None and attempt["provider"] == "vastai" and attempt["machine_id"] and self.bans is not None:
            await self.bans.ban(attempt["machine_id"], f"provisioning failed (offer {attempt['offer_id']}): {reason}",
                                self.ban_seconds)
