"""What node join and gateway registration share: token check and key ownership.

Contract (inside the caller's join transaction):
* the join token must exist, be of ``kind`` and not be expired (else the one 401);
* the public key is looked up among the caller's own kind (``own_table``): a match is a
  re-join of that node or gateway; a used single-use token is only good for that owner;
* a public key of the other kind (``other_table``) is a 409 naming ``public_key``: every
  node and every gateway needs its own key pair.
"""

from __future__ import annotations

from anex_agent import wire
from anex_agent.coordinator import problems, tokens
from anex_agent.coordinator.db import Conn

_TABLES = ("nodes", "gateways")


async def claim(
    tx: Conn, secret: str, kind: wire.TokenKind, public_key: str, *, own_table: str, other_table: str,
    conflict: str, now: float,
) -> tuple[dict, dict | None]:
    """Check ``secret`` and ``public_key`` for a join of ``kind``; return ``(token row, existing row)``,
    ``existing`` being the row of the same kind already holding the key (a re-join) or None.
    ``conflict`` is the detail of the 409."""
    assert own_table in _TABLES and other_table in _TABLES and own_table != other_table
    token = await tokens.lookup(tx, secret, kind, now=now)
    existing = await tx.fetchrow(f"SELECT * FROM {own_table} WHERE public_key = $1", public_key)
    tokens.check_unused_or_owner(token, existing["id"] if existing else None)
    if await tx.fetchval(f"SELECT id FROM {other_table} WHERE public_key = $1", public_key):
        raise problems.Problem(
            409, "Conflict", conflict, slug="conflict",
            errors=[{"field": "public_key", "message": f"already used by a {other_table.removesuffix('s')}"}],
        )
    return token, existing
