"""Vast.AI machine bans (Anex docs: "machines that fail provisioning are banned for the
configured timeout and skipped on subsequent retries. RunPod does not implement bans").

A ban keys on the Vast.AI ``machine_id`` (stable across offers), carries a reason and an
expiry time; an expired ban is ignored at once and deleted by the next write. Bans live in
the coordinator's database (table ``selection_bans``, migration 100, SQL portable between
SQLite and PostgreSQL) through :class:`BanStore`; :class:`MemoryBans` is the same contract
in memory for use without a coordinator.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

DEFAULT_BAN_SECONDS = 3600.0  # the configured timeout when a request gives none

BANS_TABLE_SQL = """
CREATE TABLE selection_bans (
    machine_id TEXT PRIMARY KEY,
    provider TEXT NOT NULL,
    reason TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX selection_bans_expiry ON selection_bans (expires_at)
"""


_UPSERT = """
INSERT INTO selection_bans (machine_id, provider, reason, created_at, expires_at) VALUES ($1, 'vastai', $2, $3, $4)
ON CONFLICT (machine_id) DO UPDATE SET reason = excluded.reason, created_at = excluded.created_at,
    expires_at = CASE WHEN excluded.expires_at > selection_bans.expires_at THEN excluded.expires_at
                      ELSE selection_bans.expires_at END
RETURNING expires_at
"""


@dataclass(frozen=True)
class Ban:
    machine_id: str
    reason: str
    created_at: float
    expires_at: float
    provider: str = "vastai"

    def to_dict(self) -> dict[str, Any]:
        return {"machine_id": self.machine_id, "provider": self.provider, "reason": self.reason,
                "created_at": self.created_at, "expires_at": self.expires_at}


class BanStore:
    """Bans in the coordinator database. ``db`` offers ``fetch``/``execute`` with ``$n`` placeholders."""

    def __init__(self, db: Any, *, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.clock = clock

    async def ban(self, machine_id: str, reason: str, seconds: float) -> Ban:
        """Ban (or re-ban, extending to the later expiry) ``machine_id`` for ``seconds``."""
        now = self.clock()
        expires = now + seconds
        async with self.db.transaction() as tx:
            await tx.execute("DELETE FROM selection_bans WHERE expires_at <= $1", now)
            # one upsert: concurrent reports for one machine (also on two coordinators) all succeed
            expires = float(await tx.fetchval(_UPSERT, machine_id, reason, now, expires))
        return Ban(machine_id, reason, now, expires)

    async def unban(self, machine_id: str) -> bool:
        return await self.db.execute("DELETE FROM selection_bans WHERE machine_id = $1", machine_id) > 0

    async def active(self) -> list[Ban]:
        rows = await self.db.fetch(
            "SELECT machine_id, provider, reason, created_at, expires_at FROM selection_bans "
            "WHERE expires_at > $1 ORDER BY machine_id", self.clock())
        return [Ban(r["machine_id"], r["reason"], float(r["created_at"]), float(r["expires_at"]), r["provider"])
                for r in rows]

    async def banned_machines(self) -> frozenset[str]:
        return frozenset(b.machine_id for b in await self.active())


class MemoryBans:
    """The :class:`BanStore` contract in memory."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._bans: dict[str, Ban] = {}

    async def ban(self, machine_id: str, reason: str, seconds: float) -> Ban:
        now = self.clock()
        old = self._bans.get(machine_id)
        expires = now + seconds if old is None else max(now + seconds, old.expires_at)
        self._bans[machine_id] = Ban(machine_id, reason, now, expires)
        return self._bans[machine_id]

    async def unban(self, machine_id: str) -> bool:
        return self._bans.pop(machine_id, None) is not None

    async def active(self) -> list[Ban]:
        now = self.clock()
        return sorted((b for b in self._bans.values() if b.expires_at > now), key=lambda b: b.machine_id)

    async def banned_machines(self) -> frozenset[str]:
        return frozenset(b.machine_id for b in await self.active())
