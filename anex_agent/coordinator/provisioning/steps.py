"""The provisioning loop's steps: what is done to a provision in each state it is worked on in.

:meth:`Steps.step` is one step of one provision, run by its task (:mod:`.scheduler`); it starts
from the provision's row (:mod:`.store`) and returns the seconds until the next step (None:
nothing left to do). Every attempt is recorded with how it ended; state moves go through
:class:`.transitions.Transitions`.

* ``selecting``: a live offer search (:class:`.selector.Selector`), skipping offers this
  provision already tried in this round; any rental of the provision still listed is
  destroyed (never two machines); the first candidate becomes attempt *n* and the state
  ``renting``. No candidate, or ``max_attempts`` reached in the round: the recovery policy
  (:mod:`.policy`, :func:`.recovery.decide`) retries after its backoff (a new round) when it
  retries on the round's event within its window, else ``failed`` with the reason.
* ``renting``: the rent call is counted in the row *before* it is made. When an earlier call
  of this attempt may have rented (the provider was unavailable, or the coordinator died
  during the call), the provider's rentals carrying the provision's label are listed first
  and one found is adopted: a provision never pays for two machines. Otherwise boot
  credentials are issued (:class:`.boot.BootIssuer`: a single-use join token bound to the
  provision that expires at the boot deadline, in the environment or in a start script that
  downloads the agent, as the provision's ``agent`` says) and the offer is rented.
  A rent call unanswered within the ``rent`` phase deadline: the attempt ends ``deadline``.
  :class:`~anex_agent.providers.rentals.RentRefused`: the attempt ends ``refused``, next candidate.
  :class:`~anex_agent.providers.rentals.NoCapacity`: listed at once; nothing found: ``refused``, next candidate.
  :class:`~anex_agent.providers.rentals.ProviderUnavailable` (or any other error: the outcome is unknown):
  raised to the scheduler, which retries with backoff (``Retry-After`` honoured), listing first; after
  ``rent_tries`` calls the attempt ends ``unavailable`` (a rental made meanwhile is destroyed
  by the reconciler). :class:`.boot.BootUnavailable` (no agent file to download): ``failed``.
* :class:`~anex_agent.providers.rentals.KeyRefused` in any step (:meth:`Steps.key_refused`): ``failed``
  with the reason (``deleting``: stays, retried slowly, the reason says why).
* ``booting``: the node that joined with the provision's token is its node; once it is
  ``ready`` (it heartbeats) the provision is ``ready``. Each phase has its deadline (the
  machine running at its provider, asked every ``status_interval`` s; the join; the first
  heartbeat: :func:`.recovery.late_phase`), and the boot deadline caps them all: past one, the
  rental is destroyed, the node removed, a Vast.AI machine banned, and the attempt ends
  ``deadline`` (the phase named) or ``boot_timeout``: next candidate. A machine the provider
  reports stopped ends ``interrupted``: next candidate.
* ``ready``: watched by :mod:`.ready`, not stepped.
* ``deleting``: the rental is destroyed first (retried until the provider confirms; an
  unknown rent outcome is settled by listing), then the node removed: ``deleted``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from anex_agent.coordinator import nodes
from anex_agent.coordinator.provisioning import boot, recovery, registry_auth, store
from anex_agent.coordinator.provisioning.config import ProvisioningSettings
from anex_agent.wire.provisioning import ProvisionState as S
from anex_agent.coordinator.provisioning.policy import NO_CAPACITY
from anex_agent.coordinator.provisioning.selector import DEFAULT_DISK_GB, Selector
from anex_agent.coordinator.provisioning.transitions import Transitions
from anex_agent.providers.rentals import (
    KeyRefused, NoCapacity, ProviderUnavailable, Rental, RentRefused, RentRequest, rental_label,
)
from anex_agent.selection.annotations import AnnotationError, parse_annotations
from anex_agent.wire.heartbeat import NodeState

if TYPE_CHECKING:
    from anex_agent.coordinator.context import Coordinator

log = logging.getLogger(__name__)

JOINED_POLL = 0.1  # seconds between looks at a joined node that has not heartbeated yet


class Steps:
    def __init__(self, ctx: Coordinator, transitions: Transitions, *, selector: Selector, issuer: boot.BootIssuer,
                 settings: ProvisioningSettings) -> None:
        self.ctx = ctx
        self.transitions = transitions
        self.selector = selector
        self.issuer = issuer
        self.settings = settings
        self._status_at: dict[str, float] = {}  # provision -> when its booting machine's status was last asked

    async def step(self, pid: str) -> float | None:
        """One step of provision ``pid``: None when nothing is left to do, else seconds until the next."""
        row = await store.get(self.ctx.db, pid)
        if row is None:
            return None
        state = S(row["state"])
        if state is S.selecting:
            return await self._select(row)
        if state is S.renting:
            return await self._rent(row)
        if state is S.booting:
            return await self._boot(row)
        if state is S.deleting:
            return await self._delete(row)
        return None

    async def key_refused(self, pid: str, err: KeyRefused) -> float | None:
        """The provider refused the API key: nothing is rented or destroyed until the key is fixed. A
        provision being made fails with the reason (the reconciler destroys what it may have rented once
        the key works); a provision being deleted keeps trying, slowly, saying why."""
        log.error("provision %s: %s", pid, err)
        row = await store.get(self.ctx.db, pid)
        if row is None:
            return None
        if row["state"] == S.deleting.value:
            await self.ctx.db.execute("UPDATE provisions SET reason = $2 WHERE id = $1", pid,
                                      f"cannot destroy the rental yet: {err.reason}")
            return self.settings.backoff_max
        reason = f"{err.provider} refused the API key: {err.reason}"
        end = (int(row["attempt"]), "failed", reason) if row["attempt"] else None
        await self.transitions.transition(pid, (S.selecting, S.renting, S.booting), S.failed, reason=reason,
                                          end=end)
        return None

    async def _select(self, row: dict) -> float | None:
        pid = row["id"]
        spec = store.spec_of(row)
        everything = await store.attempts_of(self.ctx.db, pid)
        attempts = [a for a in everything if a["number"] > int(row["round_start"] or 0)]  # this round's
        event = recovery.event_of(attempts[-1]["outcome"]) if attempts else NO_CAPACITY
        if len(attempts) >= self.settings.max_attempts:
            last = attempts[-1]["reason"] if attempts else ""
            await self.transitions.end_or_retry(pid, S.selecting, S.failed, event,
                                                f"gave up after {len(attempts)} attempts (last: {last})")
            return None
        choice = await self.selector.select(spec.annotations, providers=tuple(self.transitions.providers),
                                            exclude={(a["provider"], a["offer_id"]) for a in attempts})
        if not choice.candidates:
            await self.transitions.end_or_retry(pid, S.selecting, S.failed, event,
                                                f"no machine to rent: {choice.why_none}")
            return None
        await self._no_rental_alive(pid, everything)
        c = choice.candidates[0]
        number = len(everything) + 1
        now = self.ctx.clock()
        async with self.ctx.db.transaction() as tx:
            if await store.state_for_update(tx, pid) != S.selecting.value:
                return 0.0
            await tx.execute(
                "INSERT INTO provision_attempts (provision_id, number, provider, offer_id, machine_id, price_per_hour,"
                " gpu_count, started_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                pid, number, c.provider, c.offer_id, c.machine_id, c.price_per_hour, c.gpu_count, now)
            await store.set_state(self.ctx.db, tx, pid, S.renting, now=now,
                                  reason=f"renting {c.provider} offer {c.offer_id}", attempt=number, rent_tries=0,
                                  boot_deadline=None, node_id=None, address=None)
        self.ctx.committed()
        return 0.0

    async def _no_rental_alive(self, pid: str, attempts: list[dict]) -> None:
        """Destroy every rental of the provision the providers still list (an earlier attempt's, not yet
        gone): a provision never has two machines (raises ProviderUnavailable: retried)."""
        for name in dict.fromkeys(a["provider"] for a in attempts):
            provider = self.transitions.providers.get(name)
            while provider is not None and (found := await self.transitions.find_rental(provider, pid)) is not None:
                await provider.destroy(found.rental_id)
                log.info("provision %s: destroyed %s rental %s of an earlier attempt before renting again", pid,
                         name, found.rental_id)

    async def _rent(self, row: dict) -> float | None:
        pid = row["id"]
        attempt = await store.current_attempt(self.ctx.db, row)
        if attempt is None:  # not expected: go back to choosing
            await self.transitions.transition(pid, S.renting, S.selecting)
            return 0.0
        number = int(attempt["number"])
        provider = self.transitions.providers.get(attempt["provider"])
        if provider is None:
            await self.transitions.transition(pid, S.renting, S.selecting, end=(
                number, "failed", f"{attempt['provider']} is not configured for renting on this coordinator"))
            return 0.0
        tries = int(row["rent_tries"])
        if tries > 0:  # an earlier call may have rented: adopt before renting again
            found = await self.transitions.find_rental(provider, pid)
            if found is not None:
                log.info("provision %s: adopted %s rental %s", pid, provider.name, found.rental_id)
                await self._record_rental(pid, number, found, attempt)
                return 0.0
            if tries >= self.settings.rent_tries:
                await self.transitions.transition(pid, S.renting, S.selecting, end=(
                    number, "unavailable", f"{provider.name} did not answer {tries} rent calls"))
                return 0.0
        spec = store.spec_of(row)
        policy = self.transitions.policy_of(row)
        now = self.ctx.clock()
        deadline = now + self.settings.boot_timeout
        try:
            async with self.ctx.db.transaction() as tx:
                if await store.state_for_update(tx, pid) != S.renting.value:
                    return 0.0
                await tx.execute("UPDATE provisions SET rent_tries = rent_tries + 1 WHERE id = $1", pid)
                creds = await self.issuer.issue(tx, boot.BootRequest(
                    provision_id=pid, provider=provider.name, name=spec.name, agent=spec.agent or boot.ENTRYPOINT,
                    command=tuple(spec.command) + tuple(spec.args), now=now, expires_at=deadline))
        except boot.BootUnavailable as err:
            log.error("provision %s: %s", pid, err)
            await self.transitions.transition(pid, S.renting, S.failed, reason=str(err),
                                              end=(number, "failed", str(err)))
            return None
        login = None
        if row.get("registry_auth"):
            try:
                login = registry_auth.unseal(self.ctx.signing_key, row["registry_auth"], spec.name)
            except registry_auth.SealError as err:
                log.error("provision %s: %s", pid, err)
                await self.transitions.transition(pid, S.renting, S.failed, reason=str(err),
                                                  end=(number, "failed", str(err)))
                return None
        request = RentRequest(
            registry_login=login,
            provision_id=pid, label=rental_label(self.transitions.cluster_id, pid), offer_id=attempt["offer_id"],
            image=spec.image, env={**spec.env, **creds.env}, command=tuple(spec.command) + tuple(spec.args),
            onstart=creds.onstart, ports=tuple(spec.ports), disk_gb=_disk_gb(spec),
            gpu_count=int(attempt["gpu_count"] or 1), interruptible=policy.interruptible,
            bid_per_hour=attempt["price_per_hour"] if policy.interruptible else None,
        )
        limit = policy.deadline("rent")
        try:
            async with asyncio.timeout(limit) as clock:
                rental = await provider.rent(request)
        except TimeoutError:
            if not clock.expired():
                raise ProviderUnavailable(provider.name, "rent failed: TimeoutError") from None
            reason = f"phase rent: {provider.name} did not answer the rent call within {limit:g}s"
            log.warning("provision %s: %s; trying the next candidate", pid, reason)
            await self.transitions.transition(pid, S.renting, S.selecting, end=(number, "deadline", reason))
            return 0.0  # selecting destroys what the call may still have rented before renting again
        except RentRefused as err:
            log.info("provision %s: %s; trying the next candidate", pid, err)
            await self.transitions.transition(pid, S.renting, S.selecting, end=(number, "refused", err.reason))
            return 0.0
        except NoCapacity as err:  # nothing for this offer, it says: believe it once listing agrees
            found = await self.transitions.find_rental(provider, pid)
            if found is not None:
                log.info("provision %s: adopted %s rental %s", pid, provider.name, found.rental_id)
                await self._record_rental(pid, number, found, attempt)
                return 0.0
            log.info("provision %s: %s; trying the next candidate", pid, err)
            await self.transitions.transition(pid, S.renting, S.selecting, end=(number, "refused", err.reason))
            return 0.0
        except ProviderUnavailable:
            raise
        except Exception as err:  # unknown outcome: treat as unavailable (list before renting again)
            raise ProviderUnavailable(provider.name, f"rent failed: {type(err).__name__}") from err
        log.info("provision %s: rented %s offer %s as %s", pid, provider.name, attempt["offer_id"], rental.rental_id)
        await self._record_rental(pid, number, rental, attempt)
        return 0.0

    async def _record_rental(self, pid: str, number: int, rental: Rental, attempt: dict) -> None:
        """Write the rental to its attempt (whatever the state: a DELETE meanwhile destroys it), and go booting."""
        now = self.ctx.clock()
        price = rental.price_per_hour if rental.price_per_hour is not None else attempt["price_per_hour"]
        async with self.ctx.db.transaction() as tx:
            # the provision's row before its attempt's, as every transition takes them (no lock-order cycle)
            state = await store.state_for_update(tx, pid)
            await tx.execute(
                "UPDATE provision_attempts SET rental_id = $3, rented_at = $4, price_per_hour = $5"
                " WHERE provision_id = $1 AND number = $2", pid, number, rental.rental_id, now, price)
            if state == S.renting.value:
                await store.set_state(self.ctx.db, tx, pid, S.booting, now=now,
                                      reason=f"waiting for the node to join ({rental.provider} {rental.rental_id})",
                                      boot_deadline=now + self.settings.boot_timeout)
        self.transitions.progressed(pid)
        self.ctx.committed()

    async def _boot(self, row: dict) -> float | None:
        pid = row["id"]
        now = self.ctx.clock()
        node = await boot.joined_node(self.ctx.db, pid)
        attempt = await store.current_attempt(self.ctx.db, row)
        if node is not None:
            view = nodes.view_of(self.ctx, node)
            if view.state is NodeState.ready:
                await self.transitions.transition(pid, S.booting, S.ready, reason=None, node_id=node["id"],
                                                  address=node["address"], ready_at=now, retries=0,
                                                  retry_since=None, idle_since=None)
                log.info("provision %s: ready as node %s (%s)", pid, node["id"], node["address"])
                return None
            if row["node_id"] != node["id"]:
                await self.ctx.db.execute("UPDATE provisions SET node_id = $2, address = $3 WHERE id = $1",
                                          pid, node["id"], node["address"])
            if attempt is not None and attempt["joined_at"] is None:
                joined = float(node["created_at"])
                await self.ctx.db.execute(
                    "UPDATE provision_attempts SET joined_at = $3, running_at = COALESCE(running_at, $3)"
                    " WHERE provision_id = $1 AND number = $2", pid, attempt["number"], joined)
                attempt = {**attempt, "joined_at": joined, "running_at": attempt["running_at"] or joined}
        elif attempt is not None and attempt["running_at"] is None:
            due = (attempt["rented_at"] or now) + self.transitions.policy_of(row).deadline("running")
            status = await self._provider_status(pid, attempt, now, force=now >= due)
            if status is not None and recovery.interrupted(status):
                return await self._fail_attempt(row, attempt, node, "interrupted", recovery.interrupted(status),
                                                ban=False)  # outbid: the machine itself is not at fault
            if status is not None and recovery.running(status):
                await self.ctx.db.execute("UPDATE provision_attempts SET running_at = $3"
                                          " WHERE provision_id = $1 AND number = $2", pid, attempt["number"], now)
                attempt = {**attempt, "running_at": now}
        deadline = row["boot_deadline"] or now
        if now >= deadline:
            reason = (f"node {node['id']} joined but did not report ready" if node is not None else
                      "no node joined") + f" within {self.settings.boot_timeout:.0f}s"
            return await self._fail_attempt(row, attempt, node, "boot_timeout", reason)
        phase = recovery.late_phase(self.transitions.policy_of(row), attempt, node, now)
        if isinstance(phase, str):
            return await self._fail_attempt(row, attempt, node, "deadline", phase)
        poll = JOINED_POLL if node is not None else self.settings.poll_interval
        return max(0.0, min(poll, self.settings.poll_interval, deadline - now, phase - now))

    async def _provider_status(self, pid: str, attempt: dict, now: float, *, force: bool = False) -> Rental | None:
        """The attempt's rental as its provider lists it (every ``status_interval`` s at most, unless
        ``force``: the running deadline passed, ask once more before failing), else None."""
        if not force and now < self._status_at.get(pid, float("-inf")) + self.settings.status_interval:
            return None
        self._status_at[pid] = now
        provider = self.transitions.providers.get(attempt["provider"])
        if provider is None or attempt["rental_id"] is None:
            return None
        try:
            found = await self.transitions.find_rental(provider, pid)
        except ProviderUnavailable as err:
            log.info("provision %s: cannot ask %s for the machine's status (%s)", pid, provider.name, err)
            return None
        return found if found is not None and found.rental_id == attempt["rental_id"] else None

    async def _fail_attempt(self, row: dict, attempt: dict | None, node: dict | None, outcome: str,
                            reason: str, *, ban: bool = True) -> float:
        """The booting attempt failed (a phase past its deadline, the machine interrupted): destroy its rental
        (never paid for twice), remove its node, ban a Vast.AI machine (``ban``), and try the next candidate."""
        pid = row["id"]
        log.warning("provision %s: %s; destroying the rental and trying the next candidate", pid, reason)
        await self.transitions.release_rental(pid, attempt)
        if node is not None:
            await self.transitions.remove_node(node["id"])
        if ban:
            await self.transitions.ban(attempt, reason)
        self._status_at.pop(pid, None)
        await self.transitions.transition(pid, S.booting, S.selecting, end=(int(row["attempt"]), outcome, reason),
                                          node_id=None, address=None, boot_deadline=None)
        return 0.0

    async def _delete(self, row: dict) -> float | None:
        pid = row["id"]
        attempt = await store.current_attempt(self.ctx.db, row)
        await self.transitions.release_rental(pid, attempt)
        if attempt is not None:
            async with self.ctx.db.transaction() as tx:
                await store.end_attempt(tx, pid, int(attempt["number"]), "deleted", "the provision was deleted",
                                        now=self.ctx.clock())
        node = await boot.joined_node(self.ctx.db, pid)
        for node_id in {row["node_id"], node["id"] if node else None} - {None}:
            await self.transitions.remove_node(node_id)
        async with self.ctx.db.transaction() as tx:
            await boot.revoke_unused(tx, pid)
        await self.transitions.transition(pid, S.deleting, S.deleted, reason=None, node_id=None)
        log.info("provision %s: deleted (rental destroyed, node removed)", pid)
        return None


def _disk_gb(spec) -> float:
    """The body's ``disk_gb``, else what the annotations ask to allocate, else :data:`DEFAULT_DISK_GB`."""
    if spec.disk_gb:
        return float(spec.disk_gb)
    try:
        asked = parse_annotations(spec.annotations).disk_to_allocate_gb
    except AnnotationError:
        asked = None
    return float(asked) if asked else DEFAULT_DISK_GB
