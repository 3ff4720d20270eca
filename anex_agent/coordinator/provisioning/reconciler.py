"""The provisioning loop's reconciler: what the providers rent for this cluster against the provisions.

:meth:`Reconciler.run` reconciles every ``reconcile_interval`` s (the scheduler also reconciles once
at start, :mod:`.scheduler`). :meth:`Reconciler.reconcile` lists each provider's rentals with the
cluster's label prefix: a rental of no live provision (unknown, failed, lost, deleted, or not the
provision's current rental) is destroyed; a booting or ready provision whose rental is missing
``lost_after`` times in a row (:attr:`Reconciler.missing`) is ``lost`` (event ``interruption``: the
policy may retry) and its node revoked (removed); one whose rental the provider lists stopped
(outbid, preempted) ends ``interrupted`` the same way (a booting one: the next candidate). Provisions
in ``renting``, ``selecting`` and ``deleting`` are left alone: their own step adopts or destroys. A
provider that cannot be listed (or cannot destroy) is reconciled on the next pass.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from anex_agent.coordinator.provisioning import recovery
from anex_agent.coordinator.provisioning.config import ProvisioningSettings
from anex_agent.wire.provisioning import LIVE_STATES, ProvisionState as S
from anex_agent.coordinator.provisioning.transitions import Transitions
from anex_agent.providers.rentals import (
    ProviderUnavailable, Rental, RentalProvider, cluster_label_prefix, provision_of_label,
)

if TYPE_CHECKING:
    from anex_agent.coordinator.context import Coordinator

log = logging.getLogger(__name__)


class Reconciler:
    def __init__(self, ctx: Coordinator, transitions: Transitions, settings: ProvisioningSettings) -> None:
        self.ctx = ctx
        self.transitions = transitions
        self.settings = settings
        self.missing: dict[str, int] = {}  # rental id -> reconciliations in a row it was not listed
        self._reconciled = asyncio.Event()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reconcile_interval)
            try:
                await self.reconcile()
            except Exception:
                log.exception("provisioning: reconciliation failed; retrying on schedule")

    async def reconcile(self) -> None:
        """Compare every provider's labelled rentals with the provisions (see the module docstring)."""
        prefix = cluster_label_prefix(self.transitions.cluster_id)
        for name, provider in self.transitions.providers.items():
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
            pid = provision_of_label(rental.label, self.transitions.cluster_id)
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
                        await self.transitions.lose(full, name, rental.rental_id, why, destroy=True,
                                                    outcome="interrupted", event=None, final=S.selecting)
                    elif full is not None:
                        await self.transitions.lose(full, name, rental.rental_id, why, destroy=True,
                                                    outcome="interrupted")
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
                self.missing.pop(rental_id, None)
                continue
            self.missing[rental_id] = self.missing.get(rental_id, 0) + 1
            if self.missing[rental_id] < self.settings.lost_after:
                continue
            await self.transitions.lose(row, name, rental_id,
                                        f"{name} no longer lists rental {rental_id} (the host took the machine back)")

    def forget(self, rental_id: str) -> None:
        """The rental was given up (its count of reconciliations unlisted is dropped)."""
        self.missing.pop(rental_id, None)
