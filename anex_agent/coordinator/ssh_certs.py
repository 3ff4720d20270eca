"""Issuing, auditing and revoking SSH certificates; the session reports of nodes.

Contract:
* Every certificate (user or host) gets the next serial of the ``counters`` row
  ``ssh_serial`` and a row in ``ssh_certificates`` (who asked, for which node, the key's
  fingerprint, validity, features), in the same transaction: nothing is handed out that
  the audit does not show.
* A user certificate is issued only for a node whose host key is certified (it runs an SSH
  server that follows revocations), else 409. Its only principal is the node id; its validity is
  ``ssh_certificate_ttl`` seconds unless asked otherwise, never more than
  ``ssh_certificate_max_ttl`` (422 naming ``validity``).
* A host certificate's principals are the node id and its mesh address, both assigned
  by the coordinator (never the name a node chose, which another node may choose too).
* :func:`revoke` marks a user certificate revoked and appends an ``ssh_revoked`` change for
  its node (same transaction), which the node's watch stream carries. Revoking twice is
  a no-op; revoking a host certificate is refused (delete the node instead).
* :func:`revoked_serials` lists a node's revoked user certificates not yet expired (what a
  node loads on start and after a watch snapshot).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from anex_agent.wire import ssh as ssh_wire
from anex_agent.coordinator import changes, nodes, problems, ssh_ca
from anex_agent.coordinator.db import Conn

if TYPE_CHECKING:
    from anex_agent.coordinator.auth import Principal
    from anex_agent.coordinator.context import Coordinator


def _dt(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=timezone.utc)


def _key(text: str, field: str = "public_key"):
    try:
        return ssh_ca.parse_public_key(text)
    except ssh_ca.PublicKeyRefused as err:
        raise problems.Problem(422, "Unprocessable Content", str(err), slug="validation",
                               errors=[{"field": field, "message": str(err)}]) from None


async def _next_serial(tx: Conn) -> int:
    return int(await tx.fetchval("UPDATE counters SET value = value + 1 WHERE name = 'ssh_serial' RETURNING value"))


def _who(principal: Principal) -> str:
    return f"{principal.kind}:{principal.id}" if principal.id and principal.id != principal.kind else principal.kind


async def _record(tx: Conn, *, serial: int, kind: str, node_id: str, key_id: str, principals: list[str], key,
                  issued_by: str, requested_for: str, now: float, valid_after: float, valid_before: float,
                  features: list[str]) -> None:
    await tx.execute(
        "INSERT INTO ssh_certificates (serial, kind, node_id, key_id, principals, fingerprint, issued_by,"
        " requested_for, issued_at, valid_after, valid_before, features)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        serial, kind, node_id, key_id, json.dumps(principals), ssh_ca.fingerprint(key), issued_by, requested_for,
        now, valid_after, valid_before, json.dumps(features),
    )


async def issue_user(ctx: Coordinator, node_id: str, request: ssh_wire.SshCertificateRequest,
                     principal: Principal) -> ssh_wire.SshCertificate:
    settings = ctx.settings
    validity = request.validity or settings.ssh_certificate_ttl
    if validity > settings.ssh_certificate_max_ttl:
        raise problems.Problem(
            422, "Unprocessable Content", f"validity is at most {settings.ssh_certificate_max_ttl} seconds",
            slug="validation", errors=[{"field": "validity", "message": f"at most {settings.ssh_certificate_max_ttl}"}])
    key = _key(request.public_key)
    features = [f for f in ssh_wire.FEATURES if f in request.features]
    now = ctx.clock()
    valid_after, valid_before = now - ssh_ca.CLOCK_SKEW, now + validity
    async with ctx.db.transaction() as tx:
        row = await nodes.row_of(tx, node_id)
        if not await tx.fetchval("SELECT serial FROM ssh_certificates WHERE node_id = $1 AND kind = 'host'"
                                 " AND valid_before > $2 LIMIT 1", node_id, now):
            raise problems.Problem(
                409, "Conflict", f"node {node_id} runs no SSH server: its host key was never certified (an agent "
                "with ANEX_SSH_PORT=0, or one without remote access)", slug="conflict")
        serial = await _next_serial(tx)
        key_id = ssh_wire.user_key_id(serial, node_id, features, request.requested_for)
        await _record(tx, serial=serial, kind="user", node_id=node_id, key_id=key_id, principals=[node_id], key=key,
                      issued_by=_who(principal), requested_for=request.requested_for, now=now,
                      valid_after=valid_after, valid_before=valid_before, features=features)
        cert = ctx.ssh_ca.sign_user(key, serial=serial, node_id=node_id, key_id=key_id, valid_after=valid_after,
                                    valid_before=valid_before, features=features)
    return ssh_wire.SshCertificate(
        serial=serial, certificate=cert, node_id=node_id, principals=[node_id], address=row["address"],
        port=_ssh_port(row), valid_after=_dt(int(valid_after)), valid_before=_dt(int(valid_before)),
        features=features, known_hosts=ctx.ssh_ca.known_hosts(),
    )


def _ssh_port(row: dict) -> int:
    port = json.loads(row["facts"] or "{}").get("ssh_port")
    return port if isinstance(port, int) and 0 < port < 65536 else ssh_wire.DEFAULT_PORT


async def issue_host(ctx: Coordinator, node_id: str, request: ssh_wire.SshHostCertificateRequest,
                     principal: Principal) -> ssh_wire.SshHostCertificate:
    key = _key(request.public_key)
    now = ctx.clock()
    valid_after, valid_before = now - ssh_ca.CLOCK_SKEW, now + ssh_ca.HOST_VALIDITY
    async with ctx.db.transaction() as tx:
        row = await nodes.row_of(tx, node_id)
        principals = [node_id, row["address"]]
        serial = await _next_serial(tx)
        key_id = f"anex host node={node_id} serial={serial}"
        await _record(tx, serial=serial, kind="host", node_id=node_id, key_id=key_id, principals=principals, key=key,
                      issued_by=_who(principal), requested_for="", now=now, valid_after=valid_after,
                      valid_before=valid_before, features=[])
        cert = ctx.ssh_ca.sign_host(key, serial=serial, principals=principals, key_id=key_id,
                                    valid_after=valid_after, valid_before=valid_before)
        revoked = await revoked_serials(tx, node_id, now=now)
    return ssh_wire.SshHostCertificate(
        serial=serial, certificate=cert, principals=principals, valid_before=_dt(int(valid_before)),
        user_ca_keys=ctx.ssh_ca.trusted, revoked_serials=revoked,
    )


async def revoked_serials(tx, node_id: str, *, now: float) -> list[int]:
    rows = await tx.fetch(
        "SELECT serial FROM ssh_certificates WHERE node_id = $1 AND kind = 'user' AND revoked_at IS NOT NULL"
        " AND valid_before > $2 ORDER BY serial", node_id, now)
    return [int(r["serial"]) for r in rows]


async def revocations(ctx: Coordinator, node_id: str) -> ssh_wire.SshRevocations:
    async with ctx.db.transaction() as tx:
        await nodes.row_of(tx, node_id)
        serials = await revoked_serials(tx, node_id, now=ctx.clock())
    return ssh_wire.SshRevocations(user_ca_keys=ctx.ssh_ca.trusted, revoked_serials=serials)


def _view(row: dict) -> ssh_wire.SshCertificateRecord:
    return ssh_wire.SshCertificateRecord(
        serial=int(row["serial"]), kind=row["kind"], node_id=row["node_id"], key_id=row["key_id"],
        principals=json.loads(row["principals"]), fingerprint=row["fingerprint"], issued_by=row["issued_by"],
        requested_for=row["requested_for"], issued_at=_dt(row["issued_at"]), valid_after=_dt(row["valid_after"]),
        valid_before=_dt(row["valid_before"]), features=json.loads(row["features"]),
        revoked_at=_dt(row["revoked_at"]) if row["revoked_at"] is not None else None, revoked_by=row["revoked_by"],
    )


async def audit(ctx: Coordinator, *, node_id: str | None, limit: int) -> ssh_wire.SshCertificateList:
    if node_id:
        rows = await ctx.db.fetch("SELECT * FROM ssh_certificates WHERE node_id = $1 ORDER BY serial DESC LIMIT $2",
                                  node_id, limit)
    else:
        rows = await ctx.db.fetch("SELECT * FROM ssh_certificates ORDER BY serial DESC LIMIT $1", limit)
    return ssh_wire.SshCertificateList(certificates=[_view(r) for r in rows])


async def revoke(ctx: Coordinator, serial: int, principal: Principal) -> ssh_wire.SshCertificateRecord:
    now = ctx.clock()
    async with ctx.db.transaction() as tx:
        row = await tx.fetchrow("SELECT * FROM ssh_certificates WHERE serial = $1", serial)
        if row is None:
            raise problems.not_found(f"SSH certificate {serial}")
        if row["kind"] != "user":
            raise problems.Problem(409, "Conflict", "a host certificate cannot be revoked; delete the node instead",
                                   slug="conflict", errors=[{"field": "serial", "message": "is a host certificate"}])
        # only if still unrevoked (PostgreSQL re-checks after a concurrent revoke's commit): the first
        # revocation's time and revoker stay, and its node is told once
        if row["revoked_at"] is None and await tx.execute(
                "UPDATE ssh_certificates SET revoked_at = $2, revoked_by = $3 WHERE serial = $1 AND revoked_at IS NULL",
                serial, now, _who(principal)) == 1:
            if row["valid_before"] > now and await tx.fetchval("SELECT id FROM nodes WHERE id = $1", row["node_id"]):
                await changes.append(
                    ctx.db, tx, changes.Scope.ONE_NODE, changes.ChangeType.SSH_REVOKED, target=row["node_id"],
                    payload={"serial": serial, "valid_before": float(row["valid_before"])}, now=now)
        row = await tx.fetchrow("SELECT * FROM ssh_certificates WHERE serial = $1", serial)
    ctx.committed()
    return _view(row)


async def record_sessions(ctx: Coordinator, node_id: str, report: ssh_wire.SshSessionReport) -> None:
    """Store (or update, by the node's session id) the sessions a node reports."""
    async with ctx.db.transaction() as tx:
        await nodes.row_of(tx, node_id)
        for session in report.sessions:
            await tx.execute(
                "INSERT INTO ssh_sessions (node_id, session_id, started_at, body) VALUES ($1, $2, $3, $4)"
                " ON CONFLICT (node_id, session_id) DO UPDATE SET body = excluded.body",
                node_id, session.id, session.started_at.timestamp(), session.model_dump_json())


async def sessions(ctx: Coordinator, *, node_id: str | None, limit: int) -> ssh_wire.SshSessionList:
    if node_id:
        rows = await ctx.db.fetch("SELECT node_id, body FROM ssh_sessions WHERE node_id = $1"
                                  " ORDER BY started_at DESC LIMIT $2", node_id, limit)
    else:
        rows = await ctx.db.fetch("SELECT node_id, body FROM ssh_sessions ORDER BY started_at DESC LIMIT $1", limit)
    return ssh_wire.SshSessionList(sessions=[
        ssh_wire.SshSessionRecord(node_id=r["node_id"], session=ssh_wire.SshSession.model_validate_json(r["body"]))
        for r in rows])
