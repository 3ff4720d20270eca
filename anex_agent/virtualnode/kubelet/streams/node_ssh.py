"""The way to a pod's machine for exec, attach's stdin-less cousins and port-forward: its SSH server.

Contract: :func:`connect` asks the coordinator (the virtual node's admin token) for a short-lived
user certificate for the pod's node (``POST /v1/nodes/{id}/ssh-certificates``, a fresh Ed25519
key kept in memory only, principal = the node id, :data:`CERT_VALIDITY` s: it only has to be
valid when the session logs in; only the features the verb needs: ``pty`` for exec with a
terminal, ``port-forwarding`` for port-forward, never ``sftp``) and opens an asyncssh connection to the node's SSH server at its
mesh address, verifying the node's host certificate against the coordinator's CA. The
connection is the caller's to close. Failures are :class:`NodeUnreachable` with a line fit for
kubectl (no secret, no traceback).

Why SSH: it already runs on every node, on every engine and both paths, reached at the mesh
address the virtual node routes to; it gives exit statuses, a PTY with window changes, signals,
a hang-up when the channel closes (no shell left behind) and direct TCP channels to the node's
own ports (port-forward reaches ports bound to loopback too).
"""

from __future__ import annotations

import asyncio
from typing import Any

from anex_agent.remote import ssh_client
from anex_agent.errors import AnexError, ConfigError, CoordinatorError
from anex_agent.virtualnode.kubelet.context import PodTarget

CERT_VALIDITY = 60


class NodeUnreachable(AnexError):
    """The node's SSH server could not be reached or refused us; ``str()`` says which node and why."""


async def connect(coordinator: Any, target: PodTarget, *, requested_for: str, timeout: float,
                  features: list[str]) -> Any:
    """An asyncssh client connection to ``target``'s node (see the module docstring), with a
    certificate granting only ``features`` (``pty`` for a terminal, ``port-forwarding``)."""
    from anex_agent.remote.asyncssh_import import load

    asyncssh = load()
    where = f'node {target.node_id} of pod "{target.namespace}/{target.name}"'
    try:
        cert = await ssh_client.certify(coordinator, target.node_id, validity=CERT_VALIDITY,
                                        requested_for=requested_for[:128], features=features)
    except (CoordinatorError, ConfigError) as err:  # ConfigError: the node is gone from the coordinator
        raise NodeUnreachable(f"{where}: no SSH certificate from the coordinator: {err}") from None
    if not cert.port:
        raise NodeUnreachable(f"{where} runs no SSH server")
    try:
        async with asyncio.timeout(timeout):
            return await ssh_client.connect(cert)
    except (asyncssh.Error, OSError, TimeoutError) as err:
        raise NodeUnreachable(f"{where} at {cert.address}:{cert.port}: {err or type(err).__name__}") from None
