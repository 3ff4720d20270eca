"""Schema migrations: an ordered list of numbered SQL steps.

Contract:
* Each :class:`Migration` has a unique number and runs exactly once per database,
  in ascending order, each in its own transaction together with its row in
  ``schema_migrations`` (so a failed step leaves nothing behind and is retried on
  the next start).
* Numbers are ranges per owner so parallel work never collides:
  1-99 coordinator core, 100-199 machine selection, 200-299 GPU
  telemetry, 300-399 remote access, 400-499 provisioning. Other modules contribute steps with a module-level
  ``MIGRATIONS`` list in a route module (see :mod:`anex_agent.coordinator.app`).
* SQL must run on both SQLite and PostgreSQL (see :mod:`.db`). A step may give
  ``{"sqlite": ..., "postgresql": ...}`` when the dialects really differ.
* Several coordinators starting at once on one PostgreSQL are serialised with an
  advisory lock, so each step still runs once.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from collections.abc import Iterable

from anex_agent.coordinator.db import Database

log = logging.getLogger(__name__)

_PG_MIGRATION_LOCK = 0x616E6578  # "anex": pg_advisory_xact_lock key for migrations


@dataclass(frozen=True)
class Migration:
    number: int
    name: str
    sql: str | dict[str, str]

    def statements(self, dialect: str) -> list[str]:
        text = self.sql if isinstance(self.sql, str) else self.sql[dialect]
        return [s.strip() for s in text.split(";") if s.strip()]


CORE: list[Migration] = [
    Migration(
        1,
        "core schema",
        """
        CREATE TABLE settings (
            name TEXT PRIMARY KEY,
            value TEXT NOT NULL
        );
        CREATE TABLE counters (
            name TEXT PRIMARY KEY,
            value BIGINT NOT NULL
        );
        INSERT INTO counters (name, value) VALUES ('version', 0);
        INSERT INTO counters (name, value) VALUES ('pruned_through', 0);
        INSERT INTO counters (name, value) VALUES ('gateways_version', 0);
        CREATE TABLE join_tokens (
            id TEXT PRIMARY KEY,
            token_hash TEXT NOT NULL UNIQUE,
            kind TEXT NOT NULL,
            reusable INTEGER NOT NULL,
            labels TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL,
            used_at DOUBLE PRECISION,
            used_by TEXT,
            use_count BIGINT NOT NULL DEFAULT 0
        );
        CREATE TABLE addresses (
            n BIGINT PRIMARY KEY,
            owner TEXT,
            quarantined_until DOUBLE PRECISION
        );
        CREATE INDEX addresses_quarantine ON addresses (quarantined_until);
        CREATE TABLE nodes (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            provider TEXT NOT NULL,
            public_key TEXT NOT NULL UNIQUE,
            credential_hash TEXT NOT NULL UNIQUE,
            address TEXT NOT NULL UNIQUE,
            labels TEXT NOT NULL,
            facts TEXT NOT NULL,
            tunnels TEXT NOT NULL,
            state TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            last_heartbeat_at DOUBLE PRECISION,
            status TEXT,
            telemetry TEXT,
            health TEXT NOT NULL DEFAULT 'unknown',
            health_reasons TEXT NOT NULL DEFAULT '[]',
            config_version BIGINT NOT NULL DEFAULT 0,
            join_token_id TEXT
        );
        CREATE INDEX nodes_state ON nodes (state);
        CREATE TABLE gateways (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            public_key TEXT NOT NULL UNIQUE,
            credential_hash TEXT NOT NULL UNIQUE,
            address TEXT NOT NULL UNIQUE,
            endpoint TEXT,
            ws_url TEXT,
            routes TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            last_seen_at DOUBLE PRECISION
        );
        CREATE TABLE changes (
            version BIGINT PRIMARY KEY,
            scope TEXT NOT NULL,
            target TEXT,
            type TEXT NOT NULL,
            payload TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL
        );
        CREATE INDEX changes_scope ON changes (scope, version)
        """,
    ),
    # use limits and provider limits; existing tokens keep their meaning (single-use: max 1,
    # reusable: no limit) and the owners they admitted (so they may re-join)
    Migration(
        2,
        "join tokens: max uses, providers, admitted owners",
        """
        ALTER TABLE join_tokens ADD COLUMN max_uses BIGINT;
        ALTER TABLE join_tokens ADD COLUMN uses BIGINT NOT NULL DEFAULT 0;
        ALTER TABLE join_tokens ADD COLUMN providers TEXT;
        UPDATE join_tokens SET max_uses = 1, uses = CASE WHEN used_by IS NULL THEN 0 ELSE 1 END WHERE reusable = 0;
        UPDATE join_tokens SET uses = use_count WHERE reusable <> 0;
        CREATE TABLE join_token_uses (
            token_id TEXT NOT NULL,
            owner_id TEXT NOT NULL,
            used_at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (token_id, owner_id)
        );
        INSERT INTO join_token_uses (token_id, owner_id, used_at)
            SELECT id, used_by, COALESCE(used_at, created_at) FROM join_tokens WHERE used_by IS NOT NULL;
        INSERT INTO join_token_uses (token_id, owner_id, used_at)
            SELECT n.join_token_id, n.id, n.created_at FROM nodes n
            WHERE n.join_token_id IN (SELECT id FROM join_tokens)
            AND NOT EXISTS (SELECT 1 FROM join_token_uses u WHERE u.token_id = n.join_token_id AND u.owner_id = n.id)
        """,
    ),
    Migration(
        3,
        "join proofs and credential rotation",
        """
        CREATE TABLE proof_nonces (
            public_key TEXT NOT NULL,
            nonce TEXT NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (public_key, nonce)
        );
        CREATE INDEX proof_nonces_expiry ON proof_nonces (expires_at);
        ALTER TABLE nodes ADD COLUMN credential_issued_at DOUBLE PRECISION;
        ALTER TABLE nodes ADD COLUMN previous_credential_hash TEXT;
        ALTER TABLE nodes ADD COLUMN previous_valid_until DOUBLE PRECISION;
        CREATE INDEX nodes_previous_credential ON nodes (previous_credential_hash);
        ALTER TABLE gateways ADD COLUMN credential_issued_at DOUBLE PRECISION;
        ALTER TABLE gateways ADD COLUMN previous_credential_hash TEXT;
        ALTER TABLE gateways ADD COLUMN previous_valid_until DOUBLE PRECISION;
        CREATE INDEX gateways_previous_credential ON gateways (previous_credential_hash);
        UPDATE nodes SET credential_issued_at = created_at;
        UPDATE gateways SET credential_issued_at = created_at
        """,
    ),
    # the sweeper asks for nodes by state and heartbeat time: an index range instead of a
    # scan of the fleet every second; it replaces the index on state alone (the heartbeat
    # flush writes state, so it updated that one anyway: one index per row, as before)
    Migration(
        4,
        "nodes by state and heartbeat time",
        """
        CREATE INDEX nodes_state_heard ON nodes (state, last_heartbeat_at);
        DROP INDEX nodes_state
        """,
    ),
    # a gateway that stopped, or went silent for --gateway-gone-after, is left out of the
    # nodes' configs until it is back (its row, address and credential are kept)
    Migration(
        5,
        "gateways: gone",
        """
        ALTER TABLE gateways ADD COLUMN gone_at DOUBLE PRECISION;
        ALTER TABLE gateways ADD COLUMN gone_reason TEXT
        """,
    ),
]


async def apply(db: Database, migrations: Iterable[Migration], *, clock=time.time) -> list[int]:
    """Apply every migration not yet recorded; return the numbers applied now."""
    steps = sorted(migrations, key=lambda m: m.number)
    numbers = [m.number for m in steps]
    if len(set(numbers)) != len(numbers):
        raise ValueError(f"duplicate migration numbers in {numbers}")
    async with db.transaction() as tx:
        if db.dialect == "postgresql":
            await tx.execute(f"SELECT pg_advisory_xact_lock({_PG_MIGRATION_LOCK})")
        await tx.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            "number INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)"
        )
    applied: list[int] = []
    for step in steps:
        async with db.transaction() as tx:
            if db.dialect == "postgresql":
                await tx.execute(f"SELECT pg_advisory_xact_lock({_PG_MIGRATION_LOCK})")
            done = await tx.fetchval("SELECT number FROM schema_migrations WHERE number = $1", step.number)
            if done is not None:
                continue
            for statement in step.statements(db.dialect):
                await tx.execute(statement)
            await tx.execute(
                "INSERT INTO schema_migrations (number, name, applied_at) VALUES ($1, $2, $3)",
                step.number,
                step.name,
                clock(),
            )
            applied.append(step.number)
            log.info("applied migration %d: %s", step.number, step.name)
    return applied
