"""In-memory cache of config versions, kept current by the change feed.

The heartbeat answer carries "the coordinator's current config version for this node"
without touching the database: ``max(node's own version, gateway-set version)``.
"""

from __future__ import annotations

from anex_agent.coordinator import changes
from anex_agent.coordinator.db import Database


class ConfigVersions:
    def __init__(self, db: Database) -> None:
        self._db = db
        self._nodes: dict[str, int] = {}
        self.gateways_version = 0

    async def load(self) -> None:
        self.gateways_version = int(await self._db.fetchval("SELECT value FROM counters WHERE name = 'gateways_version'"))

    async def for_node(self, node_id: str) -> int:
        own = self._nodes.get(node_id)
        if own is None:
            own = int(await self._db.fetchval("SELECT config_version FROM nodes WHERE id = $1", node_id) or 0)
            own = max(own, self._nodes.get(node_id, 0))
            self._nodes[node_id] = own
        return max(own, self.gateways_version)

    def seed(self, node_id: str, version: int) -> None:
        """A node's own version read elsewhere (with its credential): saves a query."""
        self._nodes[node_id] = max(version, self._nodes.get(node_id, 0))

    def on_change(self, change: changes.Change) -> None:
        if change.scope == changes.Scope.RESYNC:  # missed changes: reload node versions; the gateway set may have changed
            self._nodes.clear()
            self.gateways_version = max(self.gateways_version, change.version)
        elif change.scope == changes.Scope.ALL_NODES:
            self.gateways_version = max(self.gateways_version, change.version)
        elif change.scope == changes.Scope.ONE_NODE and change.target:
            if change.type == changes.ChangeType.DELETED:
                self._nodes.pop(change.target, None)
            elif change.type == changes.ChangeType.CONFIG:
                self._nodes[change.target] = max(self._nodes.get(change.target, 0), change.version)
        elif change.scope == changes.Scope.ALL_GATEWAYS and change.type == changes.ChangeType.PEER_ADDED and change.target:
            self._nodes[change.target] = max(self._nodes.get(change.target, 0), change.version)
