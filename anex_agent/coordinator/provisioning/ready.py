"""The provisioning loop's watch on ready provisions: is each one's machine still worth keeping?

:meth:`ReadyChecks.check` (called by the scheduler every :data:`.scheduler.NODE_CHECK_INTERVAL`
s, :mod:`.scheduler`) looks at the node of every ``ready`` provision: a node deleted is ``lost``;
expired (event ``interruption``), a GPU fault (``unhealthy``, banned, event ``error``): the rental
destroyed, the node removed, then the policy retries or the provision is ``lost``; a workload not
started within its deadline: ``deadline``, the next candidate; GPUs idle for the policy's window:
``released``. Every such end goes through :meth:`.transitions.Transitions.lose`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from anex_agent.coordinator import nodes
from anex_agent.coordinator.provisioning import recovery
from anex_agent.wire.provisioning import ProvisionState as S
from anex_agent.coordinator.provisioning.policy import ERROR, RecoveryPolicy
from anex_agent.coordinator.provisioning.transitions import Transitions
from anex_agent.wire.heartbeat import NodeState

if TYPE_CHECKING:
    from anex_agent.coordinator.context import Coordinator


class ReadyChecks:
    def __init__(self, ctx: Coordinator, transitions: Transitions) -> None:
        self.ctx = ctx
        self.transitions = transitions

    async def check(self) -> None:
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
        lose = self.transitions.lose
        for row in rows:
            node = found.get(row["node_id"])
            policy = self.transitions.policy_of(row)
            if node is None:
                await lose(row, row["provider"], row["rental_id"], f"its node {row['node_id']} was deleted",
                           destroy=True, event=None)
            elif nodes.view_of(self.ctx, node).state is NodeState.expired:
                await lose(row, row["provider"], row["rental_id"],
                           f"its node {row['node_id']} expired (no heartbeat)", destroy=True)
            elif (fault := recovery.gpu_fault(node)) is not None:
                await lose(row, row["provider"], row["rental_id"], fault, destroy=True,
                           outcome="unhealthy", event=ERROR, ban=True)
            elif (late := recovery.workload_late(policy, node, row["ready_at"], now)) is not None:
                await lose(row, row["provider"], row["rental_id"], late, destroy=True, outcome="deadline",
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
            await self.transitions.lose(row, row["provider"], row["rental_id"], reason, destroy=True,
                                        outcome="idle", event=None, final=S.released)
