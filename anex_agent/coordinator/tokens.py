"""Join tokens: created by an admin, shown once, stored hashed, single-use or reusable.

Contract:
* :func:`create` returns the secret once; only its SHA-256 is stored.
* :func:`redeem` runs inside the join transaction: it checks kind and expiry and marks
  a single-use token used by the joining node with a conditional update, so two
  concurrent joins (also on two coordinators) cannot both use it. A single-use token
  may be presented again by the node that used it (same public key), so a restarted
  agent whose token is baked into its environment can re-join.
* Every failure is the same 401 (:func:`problems.unauthenticated`).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

from anex_agent import wire
from anex_agent.coordinator import credentials, problems
from anex_agent.coordinator.db import Conn


def to_datetime(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, tz=timezone.utc)


async def create(tx: Conn, request: wire.JoinTokenCreate, *, now: float) -> wire.JoinTokenCreated:
    secret = credentials.new_secret(credentials.JOIN_TOKEN)
    token_id = credentials.new_id("jt")
    expires_at = now + request.expires_in
    await tx.execute(
        "INSERT INTO join_tokens (id, token_hash, kind, reusable, labels, created_at, expires_at)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7)",
        token_id,
        credentials.hash_secret(secret),
        request.kind.value,
        int(request.reusable),
        json.dumps(request.labels),
        now,
        expires_at,
    )
    return wire.JoinTokenCreated(
        id=token_id,
        token=secret,
        kind=request.kind,
        reusable=request.reusable,
        expires_at=to_datetime(expires_at),
        labels=request.labels,
    )


async def lookup(tx: Conn, secret: str, kind: wire.TokenKind, *, now: float) -> dict:
    """The token row for ``secret`` if it exists, is of ``kind`` and not expired; else 401."""
    row = await tx.fetchrow("SELECT * FROM join_tokens WHERE token_hash = $1", credentials.hash_secret(secret))
    if row is None or row["kind"] != kind.value or row["expires_at"] <= now:
        raise problems.unauthenticated()
    return row


async def redeem(tx: Conn, token: dict, owner_id: str, *, now: float) -> None:
    """Mark ``token`` used by ``owner_id``; 401 if a single-use token was used by someone else."""
    if token["reusable"]:
        await tx.execute("UPDATE join_tokens SET use_count = use_count + 1 WHERE id = $1", token["id"])
        return
    changed = await tx.execute(
        "UPDATE join_tokens SET used_at = COALESCE(used_at, $2), used_by = $3, use_count = use_count + 1"
        " WHERE id = $1 AND (used_by IS NULL OR used_by = $3)",
        token["id"],
        now,
        owner_id,
    )
    if changed != 1:
        raise problems.unauthenticated()


def check_unused_or_owner(token: dict, owner_id: str | None) -> None:
    """Before doing work: a used single-use token is only good for the owner that used it."""
    if not token["reusable"] and token["used_by"] is not None and token["used_by"] != owner_id:
        raise problems.unauthenticated()


def view_of(row: dict) -> wire.JoinTokenView:
    return wire.JoinTokenView(
        id=row["id"],
        kind=row["kind"],
        reusable=bool(row["reusable"]),
        labels=json.loads(row["labels"]),
        created_at=to_datetime(row["created_at"]),
        expires_at=to_datetime(row["expires_at"]),
        used_at=to_datetime(row["used_at"]),
        used_by=row["used_by"],
        use_count=int(row["use_count"]),
    )


async def list_views(tx: Conn) -> wire.JoinTokenList:
    rows = await tx.fetch("SELECT * FROM join_tokens ORDER BY created_at, id")
    return wire.JoinTokenList(tokens=[view_of(row) for row in rows])


async def revoke(tx: Conn, token_id: str) -> None:
    """Delete a token: it can no longer be used (nodes that joined with it stay)."""
    if await tx.execute("DELETE FROM join_tokens WHERE id = $1", token_id) != 1:
        raise problems.not_found(f"join token {token_id}")
