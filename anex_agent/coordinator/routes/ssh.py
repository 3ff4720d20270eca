"""Remote access routes: the SSH CA, user certificates, their audit and revocation, host
certificates for nodes, and the nodes' session reports (docs/remote-access.md).

The CA itself is :mod:`..ssh_ca`; issuing, revoking and the audit are :mod:`..ssh_certs`.
"""

from __future__ import annotations

from anex_agent import parse
from anex_agent.wire import ssh as ssh_wire
from anex_agent.coordinator import problems, ssh_certs
from anex_agent.coordinator.auth import Auth, Principal
from anex_agent.coordinator.migrations import Migration
from anex_agent.coordinator.routes.registry import Call, QueryParam, Route, RouteRegistry

LIST_MAX = 1000

MIGRATIONS = [
    Migration(
        300,
        "remote access: SSH certificates and sessions",
        """
        CREATE TABLE ssh_certificates (
            serial BIGINT PRIMARY KEY,
            kind TEXT NOT NULL,
            node_id TEXT NOT NULL,
            key_id TEXT NOT NULL,
            principals TEXT NOT NULL,
            fingerprint TEXT NOT NULL,
            issued_by TEXT NOT NULL,
            requested_for TEXT NOT NULL,
            issued_at DOUBLE PRECISION NOT NULL,
            valid_after DOUBLE PRECISION NOT NULL,
            valid_before DOUBLE PRECISION NOT NULL,
            features TEXT NOT NULL,
            revoked_at DOUBLE PRECISION,
            revoked_by TEXT
        );
        CREATE INDEX ssh_certificates_node ON ssh_certificates (node_id, serial);
        INSERT INTO counters (name, value) VALUES ('ssh_serial', 0);
        CREATE TABLE ssh_sessions (
            node_id TEXT NOT NULL,
            session_id TEXT NOT NULL,
            started_at DOUBLE PRECISION NOT NULL,
            body TEXT NOT NULL,
            PRIMARY KEY (node_id, session_id)
        );
        CREATE INDEX ssh_sessions_started ON ssh_sessions (started_at)
        """,
    ),
]


def _own_node(call: Call) -> str:
    node_id = call.param("node_id")
    principal: Principal = call.principal
    if principal.kind == "node" and principal.id != node_id:
        raise problems.forbidden("a node may only act on itself")
    return node_id


def _node_filter(call: Call) -> str | None:
    return call.request.query.get("node_id") or None


def _limit(call: Call) -> int:
    return call.query.get("limit") or 100


async def get_ca(call: Call) -> ssh_wire.SshCa:
    ca = call.ctx.ssh_ca
    return ssh_wire.SshCa(public_keys=ca.trusted, known_hosts=ca.known_hosts())


async def create_certificate(call: Call) -> ssh_wire.SshCertificate:
    return await ssh_certs.issue_user(call.ctx, call.param("node_id"), call.body, call.principal)


async def list_certificates(call: Call) -> ssh_wire.SshCertificateList:
    return await ssh_certs.audit(call.ctx, node_id=_node_filter(call), limit=_limit(call))


async def revoke_certificate(call: Call) -> ssh_wire.SshCertificateRecord:
    raw = call.param("serial")
    try:
        serial = parse.integer(raw, minimum=1)
    except ValueError:
        raise problems.Problem(400, "Bad Request", "serial must be a positive integer", slug="bad-request",
                               errors=[{"field": "serial", "message": "a positive integer"}]) from None
    return await ssh_certs.revoke(call.ctx, serial, call.principal)


async def host_certificate(call: Call) -> ssh_wire.SshHostCertificate:
    return await ssh_certs.issue_host(call.ctx, _own_node(call), call.body, call.principal)


async def revocations(call: Call) -> ssh_wire.SshRevocations:
    return await ssh_certs.revocations(call.ctx, _own_node(call))


async def report_sessions(call: Call) -> None:
    await ssh_certs.record_sessions(call.ctx, _own_node(call), call.body)


async def list_sessions(call: Call) -> ssh_wire.SshSessionList:
    return await ssh_certs.sessions(call.ctx, node_id=_node_filter(call), limit=_limit(call))


def setup(registry: RouteRegistry, ctx) -> None:
    tags = ("remote access",)
    listing = (QueryParam("node_id", description="only this node's"),
               QueryParam("limit", "integer", f"1..{LIST_MAX}, default 100", minimum=1, maximum=LIST_MAX, default=100))
    for route in [
        Route("GET", "/v1/ssh/ca", get_ca, Auth.public,
              "The SSH CA public keys and the '@cert-authority' known_hosts lines that verify every node",
              response_model=ssh_wire.SshCa, tags=tags),
        Route("POST", "/v1/nodes/{node_id}/ssh-certificates", create_certificate, Auth.ssh_issuer,
              "A short-lived OpenSSH user certificate for one node (the principal is the node id); recorded. "
              "The admin token or the SSH issuer token",
              request_model=ssh_wire.SshCertificateRequest, response_model=ssh_wire.SshCertificate, status=201,
              tags=tags, problems=(404, 409, 422)),
        Route("GET", "/v1/ssh/certificates", list_certificates, Auth.admin,
              "The audit of issued SSH certificates (user and host), newest first",
              response_model=ssh_wire.SshCertificateList, tags=tags, query=listing),
        Route("POST", "/v1/ssh/certificates/{serial}/revoke", revoke_certificate, Auth.admin,
              "Revoke a user certificate: its node refuses it from its next watch event on",
              response_model=ssh_wire.SshCertificateRecord, tags=tags, problems=(400, 404, 409)),
        Route("POST", "/v1/nodes/{node_id}/ssh-host-certificate", host_certificate, Auth.node,
              "Certify the node's SSH host key (the node itself); with the user CA keys and revoked serials",
              request_model=ssh_wire.SshHostCertificateRequest, response_model=ssh_wire.SshHostCertificate,
              tags=tags, problems=(403, 422)),
        Route("GET", "/v1/nodes/{node_id}/ssh-revocations", revocations, Auth.node_or_admin,
              "The node's revoked, unexpired user certificates and the CA keys it trusts",
              response_model=ssh_wire.SshRevocations, tags=tags, problems=(403,)),
        Route("POST", "/v1/nodes/{node_id}/ssh-sessions", report_sessions, Auth.node,
              "Report SSH sessions (start, end, exit status) of the node itself",
              request_model=ssh_wire.SshSessionReport, status=204, tags=tags, problems=(403,)),
        Route("GET", "/v1/ssh/sessions", list_sessions, Auth.admin, "SSH sessions the nodes reported, newest first",
              response_model=ssh_wire.SshSessionList, tags=tags, query=listing),
    ]:
        registry.add(route)
