"""Provisions in the coordinator's database: the durable state the loop resumes from.

Tables (migration 400, SQL portable between SQLite and PostgreSQL):

* ``provisions``: one row per provision; ``live_name`` is the name while the provision is
  not deleted (UNIQUE: NULLs do not collide, so a deleted name may be used again);
  ``attempt`` the number of the current attempt (0: none yet); ``next_try_at`` when the
  loop may act on it again (backoff); ``rent_tries`` how many rent calls the current attempt
  made (above 0: a rental may exist, list by label before renting again);
  ``lease_owner``/``lease_until``: the coordinator process driving it (several coordinators
  on one PostgreSQL never drive one provision at once).
* ``provisions.registry_auth`` (migration 470): the provision's registry login, sealed
  (:mod:`.registry_auth`); the ``spec`` column never holds it.
* ``provision_attempts``: every attempt (offer, provider, rental id, when rented and ended,
  outcome and reason); the cost is price x time rented.

The join tokens issued to a provision carry its id (``join_tokens.provision_id``, migration
450, :mod:`.bootstrap`); a node that joined with one of them is the provision's node.

Every state change is written with a ``provisions`` change in the change log (same
transaction), which the watch stream of provisions delivers.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from anex_agent.coordinator import changes, credentials, tokens
from anex_agent.coordinator.db import Conn, Database
from anex_agent.coordinator.migrations import Migration
from anex_agent.coordinator.provisioning import boot, registry_auth
from anex_agent.wire import provisioning as models

MIGRATIONS = [
    Migration(400, "provisioning: provisions and their attempts", """
        CREATE TABLE provisions (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            live_name TEXT UNIQUE,
            spec TEXT NOT NULL,
            spec_hash TEXT NOT NULL,
            state TEXT NOT NULL,
            reason TEXT,
            created_at DOUBLE PRECISION NOT NULL,
            updated_at DOUBLE PRECISION NOT NULL,
            attempt BIGINT NOT NULL DEFAULT 0,
            rent_tries BIGINT NOT NULL DEFAULT 0,
            boot_deadline DOUBLE PRECISION,
            next_try_at DOUBLE PRECISION NOT NULL DEFAULT 0,
            node_id TEXT,
            address TEXT,
            ready_at DOUBLE PRECISION,
            lease_owner TEXT,
            lease_until DOUBLE PRECISION NOT NULL DEFAULT 0
        );
        CREATE INDEX provisions_state ON provisions (state);
        CREATE TABLE provision_attempts (
            provision_id TEXT NOT NULL,
            number BIGINT NOT NULL,
            provider TEXT NOT NULL,
            offer_id TEXT NOT NULL,
            machine_id TEXT,
            price_per_hour DOUBLE PRECISION,
            gpu_count BIGINT NOT NULL DEFAULT 1,
            rental_id TEXT,
            started_at DOUBLE PRECISION NOT NULL,
            rented_at DOUBLE PRECISION,
            ended_at DOUBLE PRECISION,
            outcome TEXT,
            reason TEXT,
            PRIMARY KEY (provision_id, number)
        );
        CREATE INDEX provision_attempts_rental ON provision_attempts (rental_id)
    """),
    registry_auth.MIGRATION,
]

CLUSTER_ID_SETTING = "cluster_id"


async def cluster_id(db: Database) -> str:
    """This cluster's id (``settings.cluster_id``), made once on first use and kept in the database."""
    found = await db.fetchval("SELECT value FROM settings WHERE name = $1", CLUSTER_ID_SETTING)
    if found:
        return found
    async with db.transaction() as tx:
        await tx.execute("INSERT INTO settings (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
                         CLUSTER_ID_SETTING, credentials.new_id("c"))
        return await tx.fetchval("SELECT value FROM settings WHERE name = $1", CLUSTER_ID_SETTING)


def spec_json(spec: models.ProvisionCreate) -> str:
    """The body as stored: everything but the registry login (sealed in its own column)."""
    return json.dumps(spec.model_dump(mode="json", exclude={"registry_auth"}), sort_keys=True, separators=(",", ":"))


def spec_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def spec_of(row: dict) -> models.ProvisionCreate:
    return models.ProvisionCreate.model_validate_json(row["spec"])


async def append_change(db: Database, tx: Conn, provision_id: str, state: str, *, now: float) -> None:
    await changes.append(db, tx, changes.Scope.PROVISIONS, changes.ChangeType.PROVISION, target=provision_id,
                         payload={"id": provision_id, "state": state}, now=now)


async def create(db: Database, spec: models.ProvisionCreate, *, now: float,
                 signing_key: bytes | None = None) -> tuple[dict, bool]:
    """``(row, created)``: a new provision in ``selecting``, or the live one of that name and body.

    A registry login is stored sealed (:mod:`.registry_auth`, under ``signing_key``) and joins the
    body's hash as its HMAC. Raises :class:`ValueError` when a live provision of that name has
    another body."""
    text = spec_json(spec)
    digest = spec_hash(text)
    sealed = None
    if spec.registry_auth is not None:
        if signing_key is None:
            raise TypeError("a provision with a registry login needs the coordinator's signing key to seal it")
        digest = f"{digest}:{registry_auth.fingerprint(signing_key, spec.registry_auth)}"
        sealed = registry_auth.seal(signing_key, spec.registry_auth, spec.name)
    async with db.transaction() as tx:
        existing = await tx.fetchrow("SELECT * FROM provisions WHERE live_name = $1", spec.name)
        if existing is not None:
            if existing["spec_hash"] != digest:
                raise ValueError(spec.name)
            return existing, False
        provision_id = credentials.new_id("pv")
        await tx.execute(
            "INSERT INTO provisions (id, name, live_name, spec, spec_hash, state, created_at, updated_at,"
            " registry_auth) VALUES ($1, $2, $2, $3, $4, 'selecting', $5, $5, $6)", provision_id, spec.name, text,
            digest, now, sealed)
        await append_change(db, tx, provision_id, "selecting", now=now)
        return await tx.fetchrow("SELECT * FROM provisions WHERE id = $1", provision_id), True


async def get(db: Database | Conn, provision_id: str) -> dict | None:
    return await db.fetchrow("SELECT * FROM provisions WHERE id = $1", provision_id)


async def get_for_update(tx: Conn, provision_id: str) -> dict | None:
    """The provision's row, locked for the rest of ``tx`` (a write that depends on it follows)."""
    return await tx.fetchrow("SELECT * FROM provisions WHERE id = $1 FOR UPDATE", provision_id)


async def state_for_update(tx: Conn, provision_id: str) -> str | None:
    """The provision's state, its row locked for the rest of ``tx``: a state moved only from an
    expected one (a compare-and-set) is never moved from under a concurrent DELETE, nor a DELETE
    from under a step."""
    return await tx.fetchval("SELECT state FROM provisions WHERE id = $1 FOR UPDATE", provision_id)


async def attempts_of(db: Database | Conn, provision_id: str) -> list[dict]:
    return await db.fetch("SELECT * FROM provision_attempts WHERE provision_id = $1 ORDER BY number", provision_id)


async def current_attempt(db: Database | Conn, row: dict) -> dict | None:
    if not row["attempt"]:
        return None
    return await db.fetchrow("SELECT * FROM provision_attempts WHERE provision_id = $1 AND number = $2",
                             row["id"], row["attempt"])


async def set_state(db: Database, tx: Conn, provision_id: str, state: models.ProvisionState, *, now: float,
                    reason: str | None = None, **columns: Any) -> None:
    """Move a provision to ``state`` (and set ``columns``), with its change-log entry."""
    sets = ["state = $2", "reason = $3", "updated_at = $4"]
    args: list[Any] = [provision_id, state.value, reason, now]
    for name, value in columns.items():
        args.append(value)
        sets.append(f"{name} = ${len(args)}")
    if state is models.ProvisionState.deleted:
        sets.append("live_name = NULL")
    await tx.execute(f"UPDATE provisions SET {', '.join(sets)} WHERE id = $1", *args)
    await append_change(db, tx, provision_id, state.value, now=now)


async def end_attempt(tx: Conn, provision_id: str, number: int, outcome: str, reason: str, *, now: float) -> None:
    """Close attempt ``number`` (once: a closed attempt keeps its first outcome) and revoke the
    provision's unused join tokens (every one was issued to this attempt or an earlier, closed one)."""
    await tx.execute(
        "UPDATE provision_attempts SET ended_at = $3, outcome = $4, reason = $5"
        " WHERE provision_id = $1 AND number = $2 AND ended_at IS NULL", provision_id, number, now, outcome, reason)
    await boot.revoke_unused(tx, provision_id)


def attempt_cost(attempt: dict, now: float) -> float:
    if attempt["rented_at"] is None or not attempt["price_per_hour"]:
        return 0.0
    end = attempt["ended_at"] if attempt["ended_at"] is not None else now
    return max(0.0, end - attempt["rented_at"]) * float(attempt["price_per_hour"]) / 3600.0


def view_of(row: dict, attempts: list[dict], *, now: float) -> models.ProvisionView:
    spec = spec_of(row)
    current = next((a for a in attempts if a["number"] == row["attempt"]), None)
    live_rental = current is not None and current["ended_at"] is None
    return models.ProvisionView(
        id=row["id"],
        name=row["name"],
        state=row["state"],
        reason=row["reason"],
        image=spec.image,
        agent=spec.agent or "entrypoint",
        annotations=spec.annotations,
        created_at=tokens.to_datetime(row["created_at"]),
        updated_at=tokens.to_datetime(row["updated_at"]),
        provider=current["provider"] if current else None,
        offer_id=current["offer_id"] if current else None,
        rental_id=current["rental_id"] if live_rental else None,
        price_per_hour=current["price_per_hour"] if live_rental else None,
        cost_usd=round(sum(attempt_cost(a, now) for a in attempts), 6),
        node_id=row["node_id"],
        address=row["address"],
        ready_at=tokens.to_datetime(row["ready_at"]),
        attempts=[models.AttemptView(
            number=int(a["number"]), provider=a["provider"], offer_id=a["offer_id"], machine_id=a["machine_id"],
            price_per_hour=a["price_per_hour"], rental_id=a["rental_id"],
            started_at=tokens.to_datetime(a["started_at"]), rented_at=tokens.to_datetime(a["rented_at"]),
            ended_at=tokens.to_datetime(a["ended_at"]), outcome=a["outcome"], reason=a["reason"],
            cost_usd=round(attempt_cost(a, now), 6), event=a.get("event"),
            running_at=tokens.to_datetime(a.get("running_at")), joined_at=tokens.to_datetime(a.get("joined_at")),
        ) for a in attempts],
        retries=int(row.get("retries") or 0),
        idle_since=tokens.to_datetime(row.get("idle_since")),
        next_retry_at=tokens.to_datetime(row["next_try_at"]) if row["state"] == "selecting" and row.get(
            "retries") and row["next_try_at"] > now else None,
    )


async def view(db: Database | Conn, provision_id: str, *, now: float) -> models.ProvisionView | None:
    row = await get(db, provision_id)
    if row is None:
        return None
    return view_of(row, await attempts_of(db, provision_id), now=now)


async def list_views(db: Database, *, now: float, include_deleted: bool = False) -> list[models.ProvisionView]:
    where = "" if include_deleted else " WHERE state <> 'deleted'"
    rows = await db.fetch(f"SELECT * FROM provisions{where} ORDER BY created_at, id")
    attempts = await db.fetch("SELECT a.* FROM provision_attempts a JOIN provisions p ON p.id = a.provision_id"
                              f"{where.replace('state', 'p.state')} ORDER BY a.provision_id, a.number")
    by_id: dict[str, list[dict]] = {}
    for a in attempts:
        by_id.setdefault(a["provision_id"], []).append(a)
    return [view_of(row, by_id.get(row["id"], []), now=now) for row in rows]


async def claim(db: Database, provision_id: str, owner: str, *, now: float, lease: float) -> bool:
    """Take (or renew) the lease on a provision for ``owner``; False when another process holds it."""
    changed = await db.execute(
        "UPDATE provisions SET lease_owner = $2, lease_until = $3 WHERE id = $1"
        " AND (lease_owner IS NULL OR lease_owner = $2 OR lease_until < $4)", provision_id, owner, now + lease, now)
    return changed == 1


async def release(db: Database, provision_id: str, owner: str) -> None:
    await db.execute("UPDATE provisions SET lease_owner = NULL, lease_until = 0 WHERE id = $1 AND lease_owner = $2",
                     provision_id, owner)
