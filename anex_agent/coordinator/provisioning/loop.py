"""The provisioning loop: select, rent, boot, watch the node join; destroy what nobody uses.

:class:`Provisioner` runs as one coordinator background task (``provisioning``) owning a
``TaskGroup``: a scheduler, the reconciler, and one named task per provision being worked
on (``provision-<id>``). Every step starts from the provision's row (:mod:`.store`), so a
restarted coordinator resumes where the last one stopped; a provision is driven by one
coordinator at a time (a lease in its row).

Steps, per state (every attempt is recorded with how it ended):

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
  retried with exponential backoff (``Retry-After`` honoured), listing first; after
  ``rent_tries`` calls the attempt ends ``unavailable`` (a rental made meanwhile is destroyed
  by the reconciler). :class:`.boot.BootUnavailable` (no agent file to download): ``failed``.
* :class:`~anex_agent.providers.rentals.KeyRefused` in any step: ``failed`` with the reason (``deleting``: stays,
  retried slowly, the reason says why).
* ``booting``: the node that joined with the provision's token is its node; once it is
  ``ready`` (it heartbeats) the provision is ``ready``. Each phase has its deadline (the
  machine running at its provider, asked every ``status_interval`` s; the join; the first
  heartbeat: :func:`.recovery.late_phase`), and the boot deadline caps them all: past one, the
  rental is destroyed, the node removed, a Vast.AI machine banned, and the attempt ends
  ``deadline`` (the phase named) or ``boot_timeout``: next candidate. A machine the provider
  reports stopped ends ``interrupted``: next candidate.
* ``ready`` (:meth:`Provisioner.check_ready_nodes`, every :data:`NODE_CHECK_INTERVAL` s): a node
  deleted is ``lost``; expired (event ``interruption``), a GPU fault (``unhealthy``, banned,
  event ``error``): the rental destroyed, the node removed, then the policy retries or the
  provision is ``lost``; a workload not started within its deadline: ``deadline``, the next
  candidate; GPUs idle for the policy's window: ``released``.
* ``deleting``: the rental is destroyed first (retried until the provider confirms; an
  unknown rent outcome is settled by listing), then the node removed: ``deleted``.

The reconciler (every ``reconcile_interval``, and once at start) lists each provider's
rentals with the cluster's label prefix: a rental of no live provision (unknown, failed,
lost, deleted, or not the provision's current rental) is destroyed; a booting or ready
provision whose rental is missing ``lost_after`` times in a row is ``lost`` (event
``interruption``: the policy may retry) and its node revoked (removed); one whose rental the
provider lists stopped (outbid, preempted) ends ``interrupted`` the same way. Provisions in
``renting`` and ``selecting`` are left alone: their own step adopts or destroys.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from anex_agent.coordinator import changes, credentials, nodes, problems
from anex_agent.coordinator.provisioning import boot, costs, recovery, registry_auth, store
from anex_agent.coordinator.provisioning.config import ProvisioningSettings
from anex_agent.coordinator.provisioning.models import LIVE_STATES, ProvisionState as S
from anex_agent.coordinator.provisioning.policy import ERROR, INTERRUPTION, NO_CAPACITY, RecoveryPolicy, parse_policy
from anex_agent.providers.rentals import (
    KeyRefused, NoCapacity, ProviderUnavailable, Rental, RentalProvider, RentRefused, RentRequest,
    cluster_label_prefix, provision_of_label, rental_label,
)
from anex_agent.coordinator.provisioning.selector import DEFAULT_DISK_GB, Selector
from anex_agent.selection.annotations import AnnotationError, parse_annotations
from anex_agent.wire.models import NodeState

if TYPE_CHECKING:
    from anex_agent.coordinator.context import Coordinator

log = logging.getLogger(__name__)

NODE_CHECK_INTERVAL = 2.0  # seconds between looks at the nodes of ready provisions
JOINED_POLL = 0.1  # seconds between looks at a joined node that has not heartbeated yet
POLICY_CACHE = 4096  # parsed recovery policies kept (by provision body)
ACTIVE = (S.selecting.value, S.renting.value, S.booting.value, S.deleting.value)


class Provisioner:
    def __init__(self, ctx: Coordinator, *, providers: Mapping[str, RentalProvider], selector: Selector,
                 issuer: boot.BootIssuer, settings: ProvisioningSettings, bans: Any = None,
                 ban_seconds: float = 3600.0) -> None:
        self.ctx = ctx
        self.providers = dict(providers)
        self.selector = selector
        self.issuer = issuer
        self.settings = settings
        self.bans = bans
        self.ban_seconds = ban_seconds
        self.owner = credentials.new_id("w")  # this process, for leases
        self.cluster_id = ""
        self._kick = asyncio.Event()
        self._running: dict[str, asyncio.Task] = {}
        self._failures: dict[str, int] = {}  # provision -> provider failures in a row (destroy backoff)
        self._missing: dict[str, int] = {}  # rental id -> reconciliations in a row it was not listed
        self._status_at: dict[str, float] = {}  # provision -> when its booting machine's status was last asked
        self._policies: dict[str, RecoveryPolicy] = {}  # provision body (JSON) -> its recovery policy
        self._reconciled = asyncio.Event()
        self.metrics_rows: list[dict] = []  # cost snapshot for /metrics (refreshed by the scheduler)
        self.started = asyncio.Event()
        self._nodes_checked_at = 0.0

    # ------------------------------------------------------------------ lifecycle

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
        self.cluster_id = await store.cluster_id(self.ctx.db)
        try:
            await self.reconcile()
        except Exception:
            log.exception("provisioning: the first reconciliation failed; retrying on schedule")
        self.started.set()
        async with asyncio.TaskGroup() as group:
            group.create_task(self._reconcile_forever(), name="provisioning-reconciler")
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

    async def check_ready_nodes(self) -> None:
        """Look at the node of every ready provision. Deleted (by an administrator): ``lost``. Expired (its
        heartbeats stopped): ``lost``, event ``interruption``. A GPU that needs a reset (a hardware XID) or a
        failed health check: the attempt ends ``unhealthy`` (event ``error``), the machine is banned (Vast.AI).
        A workload that did not start within its deadline: ``deadline``, the machine banned, the next candidate
        (as every boot phase). GPUs idle for the
        policy's window: ``released``. The rental is destroyed and the node removed in every case; the
        policy decides whether another attempt starts."""
        rows = await self.ctx.db.fetch(
            "SELECT p.id, p.node_id, p.spec, p.ready_at, p.idle_since, a.number, a.provider, a.rental_id,"
            " a.machine_id, a.offer_id FROM provisions p JOIN provision_attempts a"
            " ON a.provision_id = p.id AND a.number = p.attempt WHERE p.state = 'ready' AND p.node_id IS NOT NULL")
        if not rows:
            return
        ids = [r["node_id"] for r in rows]
        marks = ", ".join(f"${i + 1}" for i in range(len(ids)))
        found = {n["id"]: n for n in await self.ctx.db.fetch(f"SELECT * FROM nodes WHERE id IN ({marks})", *ids)}
        now = self.ctx.clock()
        for row in rows:
            node = found.get(row["node_id"])
            policy = self.policy_of(row)
            if node is None:
                await self._lose(row, row["provider"], row["rental_id"], f"its node {row['node_id']} was deleted",
                                 destroy=True, event=None)
            elif nodes.view_of(self.ctx, node).state is NodeState.expired:
                await self._lose(row, row["provider"], row["rental_id"],
                                 f"its node {row['node_id']} expired (no heartbeat)", destroy=True)
            elif (fault := recovery.gpu_fault(node)) is not None:
                await self._lose(row, row["provider"], row["rental_id"], fault, destroy=True,
                                 outcome="unhealthy", event=ERROR, ban=True)
            elif (late := recovery.workload_late(policy, node, row["ready_at"], now)) is not None:
                await self._lose(row, row["provider"], row["rental_id"], late, destroy=True, outcome="deadline",
                                 event=None, ban=True, final=S.selecting)  # a boot phase: the next candidate
            elif policy.idle_release is not None:
                await self._check_idle(row, node, policy, now)

    async def _check_idle(self, row: dict, node: dict, policy: RecoveryPolicy, now: float) -> None:
        """Release the machine once its GPUs stayed below the policy's threshold for its idle window."""
        idle = recovery.idle(node, policy.idle_threshold)
        if idle is None:
            return  # no reading: nothing to say
        if not idle:
            if row["idle_since"] is not None:
                await self.ctx.db.execute("UPDATE provisions SET idle_since = NULL WHERE id = $1", row["id"])
            return
        if row["idle_since"] is None:
            await self.ctx.db.execute("UPDATE provisions SET idle_since = $2 WHERE id = $1", row["id"], now)
            return
        if now - row["idle_since"] >= (policy.idle_release or 0):
            reason = (f"released: every GPU stayed below {policy.idle_threshold:g}% utilization for "
                      f"{policy.idle_release:g}s")
            await self._lose(row, row["provider"], row["rental_id"], reason, destroy=True, outcome="idle",
                             event=None, final=S.released)

    async def _refresh_metrics(self, now: float) -> None:
        self.metrics_rows = await self.ctx.db.fetch(costs.ROWS_SQL)

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
                    delay = await self.step(pid)
                except KeyRefused as err:
                    delay = await self._key_refused(pid, err)
                    if delay is None:
                        return
                    await self._retry_at(pid, delay)
                    return
                except ProviderUnavailable as err:
                    delay = self._backoff(pid, err.retry_after)
                    log.warning("provision %s: %s; retrying in %.0fs", pid, err, delay)
                    await self._retry_at(pid, delay)
                    return
                except Exception:
                    delay = self._backoff(pid, None)
                    log.exception("provision %s: step failed; retrying in %.0fs", pid, delay)
                    await self._retry_at(pid, delay)
                    return
                if delay is None:
                    return
                if delay > 0:
                    await self._sleep(delay)
        finally:
            await store.release(self.ctx.db, pid, self.owner)

    async def _key_refused(self, pid: str, err: KeyRefused) -> float | None:
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
        await self._transition(pid, (S.selecting, S.renting, S.booting), S.failed, reason=reason, end=end)
        return None

    def _backoff(self, pid: str, retry_after: float | None) -> float:
        n = self._failures.get(pid, 0)
        self._failures[pid] = n + 1
        delay = min(self.settings.backoff_max, self.settings.backoff * (2 ** n))
        return max(delay, retry_after or 0.0)

    async def _retry_at(self, pid: str, delay: float) -> None:
        await self.ctx.db.execute("UPDATE provisions SET next_try_at = $2 WHERE id = $1", pid,
                                  self.ctx.clock() + delay)

    # ------------------------------------------------------------------ steps

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

    async def _transition(self, pid: str, expected: S | tuple[S, ...], state: S, *, reason: str | None = None,
                          end: tuple[int, str, str] | None = None, **columns: Any) -> bool:
        """Move ``pid`` from ``expected`` to ``state`` in one transaction (ending attempt ``end``
        = ``(number, outcome, reason)`` in it); False when the state moved meanwhile (a DELETE)."""
        expected_values = {s.value for s in (expected if isinstance(expected, tuple) else (expected,))}
        now = self.ctx.clock()
        async with self.ctx.db.transaction() as tx:
            current = await tx.fetchval("SELECT state FROM provisions WHERE id = $1", pid)
            if current not in expected_values:
                return False
            if end is not None:
                await store.end_attempt(tx, pid, end[0], end[1], end[2], now=now)
                await tx.execute("UPDATE provision_attempts SET event = $3 WHERE provision_id = $1 AND number = $2"
                                 " AND event IS NULL", pid, end[0], recovery.event_of(end[1]))
            await store.set_state(self.ctx.db, tx, pid, state, now=now, reason=reason, **columns)
        self._failures.pop(pid, None)
        self.ctx.committed()
        return True

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

    async def _end_or_retry(self, pid: str, expected: S | tuple[S, ...], final: S, event: str | None, reason: str,
                            *, end: tuple[int, str, str] | None = None, **columns: Any) -> bool:
        """A round of attempts ended, or the machine was lost: back to ``selecting`` after the policy's
        backoff when it retries on ``event`` within its window, else ``final`` with the reason."""
        row = await store.get(self.ctx.db, pid)
        if row is None:
            return False
        now = self.ctx.clock()
        decision = recovery.decide(self.policy_of(row), row, event, reason, now=now)
        if isinstance(decision, str):
            return await self._transition(pid, expected, final, reason=decision, end=end, **columns)
        log.warning("provision %s: %s", pid, decision.reason)
        return await self._transition(pid, expected, S.selecting, reason=decision.reason, end=end,
                                      retries=decision.retries, retry_since=decision.since,
                                      round_start=int(row["attempt"]), next_try_at=now + decision.delay,
                                      rent_tries=0, boot_deadline=None, **columns)

    async def _no_rental_alive(self, pid: str, attempts: list[dict]) -> None:
        """Destroy every rental of the provision the providers still list (an earlier attempt's, not yet
        gone): a provision never has two machines (raises ProviderUnavailable: retried)."""
        for name in dict.fromkeys(a["provider"] for a in attempts):
            provider = self.providers.get(name)
            while provider is not None and (found := await self._find_rental(provider, pid)) is not None:
                await provider.destroy(found.rental_id)
                log.info("provision %s: destroyed %s rental %s of an earlier attempt before renting again", pid,
                         name, found.rental_id)

    async def _select(self, row: dict) -> float | None:
        pid = row["id"]
        spec = store.spec_of(row)
        everything = await store.attempts_of(self.ctx.db, pid)
        attempts = [a for a in everything if a["number"] > int(row["round_start"] or 0)]  # this round's
        event = recovery.event_of(attempts[-1]["outcome"]) if attempts else NO_CAPACITY
        if len(attempts) >= self.settings.max_attempts:
            last = attempts[-1]["reason"] if attempts else ""
            await self._end_or_retry(pid, S.selecting, S.failed, event,
                                     f"gave up after {len(attempts)} attempts (last: {last})")
            return None
        choice = await self.selector.select(spec.annotations, providers=tuple(self.providers),
                                            exclude={(a["provider"], a["offer_id"]) for a in attempts})
        if not choice.candidates:
            await self._end_or_retry(pid, S.selecting, S.failed, event, f"no machine to rent: {choice.why_none}")
            return None
        await self._no_rental_alive(pid, everything)
        c = choice.candidates[0]
        number = len(everything) + 1
        now = self.ctx.clock()
        async with self.ctx.db.transaction() as tx:
            if await tx.fetchval("SELECT state FROM provisions WHERE id = $1", pid) != S.selecting.value:
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

    async def _find_rental(self, provider: RentalProvider, pid: str) -> Rental | None:
        label = rental_label(self.cluster_id, pid)
        for rental in await provider.list_rentals(cluster_label_prefix(self.cluster_id)):
            if rental.label == label:
                return rental
        return None

    async def _rent(self, row: dict) -> float | None:
        pid = row["id"]
        attempt = await store.current_attempt(self.ctx.db, row)
        if attempt is None:  # not expected: go back to choosing
            await self._transition(pid, S.renting, S.selecting)
            return 0.0
        number = int(attempt["number"])
        provider = self.providers.get(attempt["provider"])
        if provider is None:
            await self._transition(pid, S.renting, S.selecting, end=(
                number, "failed", f"{attempt['provider']} is not configured for renting on this coordinator"))
            return 0.0
        tries = int(row["rent_tries"])
        if tries > 0:  # an earlier call may have rented: adopt before renting again
            found = await self._find_rental(provider, pid)
            if found is not None:
                log.info("provision %s: adopted %s rental %s", pid, provider.name, found.rental_id)
                await self._record_rental(pid, number, found, attempt)
                return 0.0
            if tries >= self.settings.rent_tries:
                await self._transition(pid, S.renting, S.selecting, end=(
                    number, "unavailable", f"{provider.name} did not answer {tries} rent calls"))
                return 0.0
        spec = store.spec_of(row)
        policy = self.policy_of(row)
        now = self.ctx.clock()
        deadline = now + self.settings.boot_timeout
        try:
            async with self.ctx.db.transaction() as tx:
                if await tx.fetchval("SELECT state FROM provisions WHERE id = $1", pid) != S.renting.value:
                    return 0.0
                await tx.execute("UPDATE provisions SET rent_tries = rent_tries + 1 WHERE id = $1", pid)
                creds = await self.issuer.issue(tx, boot.BootRequest(
                    provision_id=pid, provider=provider.name, name=spec.name, agent=spec.agent or boot.ENTRYPOINT,
                    command=tuple(spec.command) + tuple(spec.args), now=now, expires_at=deadline))
        except boot.BootUnavailable as err:
            log.error("provision %s: %s", pid, err)
            await self._transition(pid, S.renting, S.failed, reason=str(err), end=(number, "failed", str(err)))
            return None
        login = None
        if row.get("registry_auth"):
            try:
                login = registry_auth.unseal(self.ctx.signing_key, row["registry_auth"], spec.name)
            except registry_auth.SealError as err:
                log.error("provision %s: %s", pid, err)
                await self._transition(pid, S.renting, S.failed, reason=str(err), end=(number, "failed", str(err)))
                return None
        request = RentRequest(
            registry_login=login,
            provision_id=pid, label=rental_label(self.cluster_id, pid), offer_id=attempt["offer_id"],
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
            await self._transition(pid, S.renting, S.selecting, end=(number, "deadline", reason))
            return 0.0  # selecting destroys what the call may still have rented before renting again
        except RentRefused as err:
            log.info("provision %s: %s; trying the next candidate", pid, err)
            await self._transition(pid, S.renting, S.selecting, end=(number, "refused", err.reason))
            return 0.0
        except NoCapacity as err:  # nothing for this offer, it says: believe it once listing agrees
            found = await self._find_rental(provider, pid)
            if found is not None:
                log.info("provision %s: adopted %s rental %s", pid, provider.name, found.rental_id)
                await self._record_rental(pid, number, found, attempt)
                return 0.0
            log.info("provision %s: %s; trying the next candidate", pid, err)
            await self._transition(pid, S.renting, S.selecting, end=(number, "refused", err.reason))
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
            await tx.execute(
                "UPDATE provision_attempts SET rental_id = $3, rented_at = $4, price_per_hour = $5"
                " WHERE provision_id = $1 AND number = $2", pid, number, rental.rental_id, now, price)
            state = await tx.fetchval("SELECT state FROM provisions WHERE id = $1", pid)
            if state == S.renting.value:
                await store.set_state(self.ctx.db, tx, pid, S.booting, now=now,
                                      reason=f"waiting for the node to join ({rental.provider} {rental.rental_id})",
                                      boot_deadline=now + self.settings.boot_timeout)
        self._failures.pop(pid, None)
        self.ctx.committed()

    async def _boot(self, row: dict) -> float | None:
        pid = row["id"]
        now = self.ctx.clock()
        node = await boot.joined_node(self.ctx.db, pid)
        attempt = await store.current_attempt(self.ctx.db, row)
        if node is not None:
            view = nodes.view_of(self.ctx, node)
            if view.state is NodeState.ready:
                await self._transition(pid, S.booting, S.ready, reason=None, node_id=node["id"],
                                       address=node["address"], ready_at=now, retries=0, retry_since=None,
                                       idle_since=None)
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
            due = (attempt["rented_at"] or now) + self.policy_of(row).deadline("running")
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
        phase = recovery.late_phase(self.policy_of(row), attempt, node, now)
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
        provider = self.providers.get(attempt["provider"])
        if provider is None or attempt["rental_id"] is None:
            return None
        try:
            found = await self._find_rental(provider, pid)
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
        await self._release_rental(pid, attempt)
        if node is not None:
            await self._remove_node(node["id"])
        if ban:
            await self._ban(attempt, reason)
        self._status_at.pop(pid, None)
        await self._transition(pid, S.booting, S.selecting, end=(int(row["attempt"]), outcome, reason),
                               node_id=None, address=None, boot_deadline=None)
        return 0.0

    async def _ban(self, attempt: dict | None, reason: str) -> None:
        if attempt is not None and attempt["provider"] == "vastai" and attempt["machine_id"] and self.bans is not None:
            await self.bans.ban(attempt["machine_id"], f"provisioning failed (offer {attempt['offer_id']}): {reason}",
                                self.ban_seconds)

    async def _release_rental(self, pid: str, attempt: dict | None) -> None:
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
            found = await self._find_rental(provider, pid)
            if found is None:
                return
            rental_id = found.rental_id
            await self.ctx.db.execute("UPDATE provision_attempts SET rental_id = $3, rented_at = COALESCE(rented_at, $4)"
                                      " WHERE provision_id = $1 AND number = $2", pid, attempt["number"], rental_id,
                                      self.ctx.clock())
        await provider.destroy(rental_id)
        log.info("provision %s: destroyed %s rental %s", pid, provider.name, rental_id)

    async def _remove_node(self, node_id: str) -> None:
        try:
            await nodes.delete(self.ctx, node_id)
        except problems.Problem:  # already gone
            pass

    async def _delete(self, row: dict) -> float | None:
        pid = row["id"]
        attempt = await store.current_attempt(self.ctx.db, row)
        await self._release_rental(pid, attempt)
        if attempt is not None:
            async with self.ctx.db.transaction() as tx:
                await store.end_attempt(tx, pid, int(attempt["number"]), "deleted", "the provision was deleted",
                                        now=self.ctx.clock())
        node = await boot.joined_node(self.ctx.db, pid)
        for node_id in {row["node_id"], node["id"] if node else None} - {None}:
            await self._remove_node(node_id)
        async with self.ctx.db.transaction() as tx:
            await boot.revoke_unused(tx, pid)
        await self._transition(pid, S.deleting, S.deleted, reason=None, node_id=None)
        log.info("provision %s: deleted (rental destroyed, node removed)", pid)
        return None

    # ------------------------------------------------------------------ reconciler

    async def _reconcile_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reconcile_interval)
            try:
                await self.reconcile()
            except Exception:
                log.exception("provisioning: reconciliation failed; retrying on schedule")

    async def reconcile(self) -> None:
        """Compare every provider's labelled rentals with the provisions (see the module docstring)."""
        prefix = cluster_label_prefix(self.cluster_id)
        for name, provider in self.providers.items():
            try:
                rentals = await provider.list_rentals(prefix)
            except ProviderUnavailable as err:
                log.warning("provisioning: cannot list %s rentals (%s); reconciling it later", name, err)
                continue
            await self._reconcile_provider(name, provider, rentals)
        self._reconciled.set()

    async def _reconcile_provider(self, name: str, provider: RentalProvider, rentals: list[Rental]) -> None:
        rows = await self.ctx.db.fetch(
            "SELECT p.id, p.state, p.attempt, p.node_id, a.rental_id, a.ended_at, a.provider, a.number"
            " FROM provisions p LEFT JOIN provision_attempts a ON a.provision_id = p.id AND a.number = p.attempt"
            " WHERE p.state <> 'deleted'")
        by_id = {r["id"]: r for r in rows}
        listed = {r.rental_id for r in rentals}
        for rental in rentals:
            pid = provision_of_label(rental.label, self.cluster_id)
            row = by_id.get(pid or "")
            if row is not None and row["state"] in (S.renting.value, S.deleting.value, S.selecting.value):
                continue  # its own step adopts or destroys it
            keep = (row is not None and S(row["state"]) in LIVE_STATES and row["provider"] == name
                    and row["rental_id"] == rental.rental_id and row["ended_at"] is None)
            if keep:
                why = recovery.interrupted(rental)
                if why is not None and row is not None:
                    full = await self.ctx.db.fetchrow(
                        "SELECT p.id, p.node_id, p.spec, a.number, a.machine_id, a.offer_id, a.provider FROM provisions"
                        " p JOIN provision_attempts a ON a.provision_id = p.id AND a.number = p.attempt"
                        " WHERE p.id = $1", row["id"])
                    if full is not None and row["state"] == S.booting.value:  # as while booting: the next candidate
                        await self._lose(full, name, rental.rental_id, why, destroy=True, outcome="interrupted",
                                         event=None, final=S.selecting)
                    elif full is not None:
                        await self._lose(full, name, rental.rental_id, why, destroy=True, outcome="interrupted")
                continue
            try:
                await provider.destroy(rental.rental_id)
                log.warning("provisioning: destroyed %s rental %s (label %s): it belongs to no live provision",
                            name, rental.rental_id, rental.label)
            except ProviderUnavailable as err:
                log.warning("provisioning: cannot destroy dangling %s rental %s (%s); retrying later", name,
                            rental.rental_id, err)
        for row in rows:
            if row["state"] not in (S.booting.value, S.ready.value) or row["provider"] != name:
                continue
            rental_id = row["rental_id"]
            if rental_id is None or row["ended_at"] is not None:
                continue
            if rental_id in listed:
                self._missing.pop(rental_id, None)
                continue
            self._missing[rental_id] = self._missing.get(rental_id, 0) + 1
            if self._missing[rental_id] < self.settings.lost_after:
                continue
            await self._lose(row, name, rental_id,
                             f"{name} no longer lists rental {rental_id} (the host took the machine back)")

    async def _lose(self, row: dict, provider: str, rental_id: str | None, reason: str, *,
                    destroy: bool = False, outcome: str = "lost", event: str | None = INTERRUPTION,
                    ban: bool = False, final: S = S.lost) -> None:
        """The machine is gone or given up: the attempt ends ``outcome`` with ``reason``, the provision
        goes ``final`` (``lost``), unless its policy retries on ``event``: back to ``selecting``. Its node is
        revoked; ``destroy``: its rental too (selecting destroys it before renting again, else the
        reconciler); ``ban``: a Vast.AI machine is banned."""
        pid = row["id"]
        expected = (S.ready,) if final is S.released else (S.booting, S.ready)
        if not await self._end_or_retry(pid, expected, final, event, reason,
                                        end=(int(row["number"]), outcome, reason)):
            return
        if rental_id is not None:
            self._missing.pop(rental_id, None)
        log.warning("provision %s: %s: %s; revoking its node", pid, outcome, reason)
        if ban:
            await self._ban(row, reason)
        node = await boot.joined_node(self.ctx.db, pid)
        for node_id in {row["node_id"], node["id"] if node else None} - {None}:
            await self._remove_node(node_id)
        rental_provider = self.providers.get(provider)
        if destroy and rental_id is not None and rental_provider is not None:
            try:
                await rental_provider.destroy(rental_id)
                log.info("provision %s: destroyed %s rental %s", pid, provider, rental_id)
            except ProviderUnavailable as err:
                log.warning("provision %s: cannot destroy %s rental %s now (%s); the reconciler will", pid,
                            provider, rental_id, err)
        self.kick()

    # ------------------------------------------------------------------ metrics

    def render_metrics(self) -> bytes:
        """The cost series, from the snapshot the scheduler keeps (no database call on a scrape)."""
        return costs.render(self.metrics_rows, self.ctx.clock())

def _disk_gb(spec) -> float:
    """The body's ``disk_gb``, else what the annotations ask to allocate, else :data:`DEFAULT_DISK_GB`."""
    if spec.disk_gb:
        return float(spec.disk_gb)
    try:
        asked = parse_annotations(spec.annotations).disk_to_allocate_gb
    except AnnotationError:
        asked = None
    return float(asked) if asked else DEFAULT_DISK_GB
