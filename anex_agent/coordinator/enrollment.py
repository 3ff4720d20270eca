"""What node join and gateway registration share: proof of key possession, token check and
key ownership.

Contract (inside the caller's join transaction):
* the request must carry a ``proof`` that the caller holds the private key of the public
  key it names (:mod:`anex_agent.wire.proof`, against the coordinator's key): the MAC must hold
  and its timestamp lie within :data:`anex_agent.wire.proof.WINDOW` seconds of ours; else the
  one 401. Its nonce is recorded (``proof_nonces``, primary key ``(public_key, nonce)``,
  shared by every coordinator on the database) until the window has passed, so a replayed
  request is the same 401;
* the join token must exist, be of ``kind`` and not be expired (else a 401 saying which:
  :func:`anex_agent.coordinator.tokens.lookup`);
* the public key is looked up among the caller's own kind (``own_table``): a match is a
  re-join of that node or gateway (its row locked for the rest of the transaction, so a
  concurrent delete either waits for the re-join or is seen by it); a used single-use token
  is only good for that owner;
* a public key of the other kind (``other_table``) is a 409 naming ``public_key``: every
  node and every gateway needs its own key pair. Both lookups run under a lock on the key
  (:meth:`Database.lock_in`, :data:`KEY_LOCK`), so a node's join and a gateway's registration
  with one key on two coordinators at once cannot both miss the other's row: the second waits
  for the first and is the 409.
"""

from __future__ import annotations

import logging

from anex_agent.wire import proof
from anex_agent.wire.gateways import GatewayRegisterRequest
from anex_agent.wire.join import KeyProof, TokenKind
from anex_agent.wire.nodes import NodeJoinRequest
from anex_agent.coordinator import problems, tokens
from anex_agent.coordinator.db import Conn, Database
from anex_agent.net.peer_log import LogBudget, peer_text

log = logging.getLogger(__name__)
#: refused proofs logged a minute; anex_coordinator_http_requests_total{status="401"} counts every one
_REFUSALS_LOGGED = LogBudget(burst=10, interval=60.0)

_TABLES = ("nodes", "gateways")
PURPOSE = {TokenKind.node: proof.NODE_JOIN, TokenKind.gateway: proof.GATEWAY_REGISTRATION}
#: the lock namespace of a public key being joined or registered (:meth:`Database.lock_in`)
KEY_LOCK = 0x616E6B31


def check_proof(
    request: NodeJoinRequest | GatewayRegisterRequest, kind: TokenKind, *, coordinator_private: bytes,
    now: float,
) -> None:
    """The 401 unless ``request.proof`` proves possession of ``request.public_key``'s private key."""
    given = request.proof
    if given is None:
        raise problems.unauthenticated()
    try:
        proof.verify(
            PURPOSE[kind], coordinator_private=coordinator_private, public_key=request.public_key,
            timestamp=given.timestamp, nonce=given.nonce, mac=given.mac,
            fields=request.model_dump(mode="json", exclude={"proof"}, exclude_unset=True), now=now,
        )
    except proof.ProofError as err:
        skipped = _REFUSALS_LOGGED.take()
        if skipped is not None:
            log.info("refused a %s request for key %s: proof %s%s", kind.value, peer_text(request.public_key), err,
                     f" ({skipped} more refusals not logged; anex_coordinator_http_requests_total counts them by status)"
                     if skipped else "")
        raise problems.unauthenticated() from None


async def spend_nonce(tx: Conn, public_key: str, given: KeyProof, *, now: float) -> None:
    """Record the proof's nonce; the 401 when it was seen before (a replay)."""
    inserted = await tx.execute(
        "INSERT INTO proof_nonces (public_key, nonce, expires_at) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
        public_key, given.nonce, float(given.timestamp + proof.WINDOW + 1),
    )
    if inserted != 1:
        log.info("refused a replayed join proof for key %s", public_key)
        raise problems.unauthenticated()


async def prune_nonces(db: Database, *, now: float) -> int:
    """Forget nonces whose proofs are too old to be accepted anyway; return how many."""
    return await db.execute("DELETE FROM proof_nonces WHERE expires_at < $1", now)


async def claim(
    db: Database, tx: Conn, request: NodeJoinRequest | GatewayRegisterRequest, kind: TokenKind, *,
    coordinator_private: bytes, own_table: str, other_table: str, conflict: str, now: float,
) -> tuple[dict, dict | None]:
    """Check the proof, the token and the key for a join of ``kind``; return ``(token row, existing row)``,
    ``existing`` being the row of the same kind already holding the key (a re-join) or None.
    ``conflict`` is the detail of the 409."""
    assert own_table in _TABLES and other_table in _TABLES and own_table != other_table
    check_proof(request, kind, coordinator_private=coordinator_private, now=now)
    token = await tokens.lookup(tx, request.token, kind, now=now)
    assert request.proof is not None
    await spend_nonce(tx, request.public_key, request.proof, now=now)
    await db.lock_in(tx, KEY_LOCK, request.public_key)  # the key may be in neither table yet: see above
    # for update: a re-join writes this row; a delete committed meanwhile (another coordinator) is
    # waited for and seen (no row: a first join), instead of a credential for a row that is gone
    existing = await tx.fetchrow(f"SELECT * FROM {own_table} WHERE public_key = $1 FOR UPDATE", request.public_key)
    tokens.check_unused_or_owner(token, existing["id"] if existing else None)
    if await tx.fetchval(f"SELECT id FROM {other_table} WHERE public_key = $1", request.public_key):
        raise problems.Problem(
            409, "Conflict", conflict, slug="conflict",
            errors=[{"field": "public_key", "message": f"already used by a {other_table.removesuffix('s')}"}],
        )
    return token, existing
