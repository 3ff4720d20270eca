"""Boot credentials: what a rented machine gets to join the mesh as this provision's node.

The seam between the provisioning loop and the bootstrap (:mod:`.bootstrap`). The loop calls
``await issuer.issue(tx, BootRequest(...))`` inside its own transaction and gives the rental
the returned :class:`BootCredentials`: ``env`` joins the rental's environment, ``onstart``
(when set) is its start script.

:class:`BootstrapIssuer` is the one issuer. Every rent call gets a **single-use node join
token bound to the provision** (:func:`.bootstrap.issue`: ``join_tokens.provision_id``),
expiring at the boot deadline, limited to the rental's provider, labelled
``anex.sh/provision: <id>``. How the agent starts is the provision's ``agent`` field:

* ``entrypoint``: the image's entrypoint is the agent (the agent image). The token travels in
  the agent's environment (:func:`.bootstrap.boot_env`: ``ANEX_COORDINATOR_URL``,
  ``ANEX_JOIN_TOKEN``, ``ANEX_PROVIDER``, ``ANEX_NODE_NAME``); no start script.
* ``download``: any image. The start script (:func:`.bootstrap.start_script`) downloads the
  single-file agent from the coordinator (``GET /v1/agent/<arch>``, the token as bearer),
  checks it against the hashes of the coordinator's ``--agent-binary`` files, and runs the
  pod's command under it; the token is in the script only (written to a 0600 file there), not
  in the rental's environment. With no agent file configured (or readable), :class:`BootUnavailable`.

A node that joined with one of the provision's tokens is the provision's node
(:func:`joined_node`); :func:`revoke_unused` forgets the tokens no node used.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from anex_agent.wire.base import Provider
from anex_agent.coordinator.db import Conn
from anex_agent.coordinator.provisioning import bootstrap
from anex_agent.errors import AnexError

PROVISION_LABEL = bootstrap.PROVISION_LABEL
ENTRYPOINT, DOWNLOAD = "entrypoint", "download"
AGENT_STARTS = (ENTRYPOINT, DOWNLOAD)
#: variables the boot credentials or the start script set; a provision's own env may not name them
RESERVED_ENV = frozenset({"ANEX_COORDINATOR_URL", "ANEX_JOIN_TOKEN", "ANEX_JOIN_TOKEN_FILE", "ANEX_PROVIDER",
                          "ANEX_NODE_NAME", "ANEX_STATE_DIR", "ANEX_CA_FILE"})


class BootUnavailable(AnexError):
    """The coordinator cannot boot the agent the way the provision asks (no agent file to download)."""


@dataclass(frozen=True)
class BootRequest:
    provision_id: str
    provider: str  # the rental's provider (vastai, runpod, ...)
    name: str  # the node name the machine joins with
    agent: str  # ENTRYPOINT or DOWNLOAD
    command: tuple[str, ...]  # the pod's command and args (run under the agent by the start script)
    now: float
    expires_at: float  # the boot deadline: the token expires then


@dataclass(frozen=True)
class BootCredentials:
    token_id: str
    env: Mapping[str, str] = field(repr=False)  # may hold the secret
    onstart: str | None = field(default=None, repr=False)  # may hold the secret


class BootIssuer(Protocol):
    async def issue(self, tx: Conn, request: BootRequest) -> BootCredentials: ...


AgentHashes = Callable[[], Awaitable[Mapping[str, str]]]


async def _no_agent() -> Mapping[str, str]:
    return {}


@dataclass(frozen=True)
class BootstrapIssuer:
    """Provision-bound single-use join tokens, and the start script for ``download`` (module docstring).

    ``agent_hashes()``: the SHA-256 of each agent file the coordinator serves, by architecture
    (:func:`anex_agent.coordinator.routes.agent_download.agent_sha256s`); ``ca_pem``: CA
    certificates the start script trusts for an ``https://`` coordinator."""

    coordinator_url: str
    agent_hashes: AgentHashes = _no_agent
    ca_pem: str | None = field(default=None, repr=False)

    async def issue(self, tx: Conn, request: BootRequest) -> BootCredentials:
        known = request.provider if request.provider in Provider.__members__ else None
        hashes: Mapping[str, str] = {}
        if request.agent == DOWNLOAD:
            try:
                hashes = await self.agent_hashes()
            except OSError as err:
                raise BootUnavailable(f"the provision downloads the agent, but the agent file cannot be read "
                                      f"({err.strerror or type(err).__name__}: {err.filename})") from None
            if not hashes:
                raise BootUnavailable("the provision downloads the agent, but this coordinator serves no agent "
                                      "file (start it with --agent-binary PATH)")
            if not request.command:
                raise BootUnavailable("the provision downloads the agent but has no command to run under it")
        made = await bootstrap.issue(tx, request.provision_id, expires_at=request.expires_at, now=request.now,
                                     provider=known)
        if request.agent == DOWNLOAD:
            script = bootstrap.start_script(self.coordinator_url, made.secret, dict(hashes), request.command,
                                            env={"ANEX_PROVIDER": known or "other", "ANEX_NODE_NAME": request.name},
                                            ca_pem=self.ca_pem)
            return BootCredentials(made.token_id, {}, onstart=script)
        env = bootstrap.boot_env(self.coordinator_url, made.secret, provider=known or "other",
                                 node_name=request.name)
        return BootCredentials(made.token_id, env)


async def joined_node(db: Conn, provision_id: str) -> dict | None:
    """The node that joined with one of the provision's tokens (the newest), or None."""
    node_id = await bootstrap.node_of_provision(db, provision_id)
    return None if node_id is None else await db.fetchrow("SELECT * FROM nodes WHERE id = $1", node_id)


async def revoke_unused(tx: Conn, provision_id: str) -> None:
    """Delete the provision's join tokens no node has used (an attempt ended; the provision is deleted).
    Used ones stay: they bind the node to the provision."""
    await tx.execute("DELETE FROM join_tokens WHERE provision_id = $1 AND uses = 0", provision_id)
