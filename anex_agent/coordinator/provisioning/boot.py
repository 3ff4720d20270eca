"""Boot credentials: what a rented machine gets to join the mesh as this provision's node.

The seam between the provisioning loop and the bootstrap: the loop calls
``await issuer.issue(tx, provision_id, attempt, expires_at)`` inside its own transaction
and puts the returned :class:`BootCredentials` ``env`` into the rental's environment (and
``onstart`` as its start script, when there is one). The issuer returns the id of the join
token it made; the loop binds it to the attempt in the same transaction (:func:`record`), and
a node that joins with that token is the provision's node (:func:`joined_node`), whatever
issued the token.

:class:`JoinTokenIssuer` is the plain issuer: a node join token made with
:func:`anex_agent.coordinator.tokens.create`, single-use (``max_uses`` 1), expiring with
the boot timeout, limited to the rental's provider, labelled with the provision
(``anex.sh/provision``: the node carries the label), and the agent's variables
``ANEX_COORDINATOR_URL``, ``ANEX_JOIN_TOKEN``, ``ANEX_PROVIDER``, ``ANEX_NODE_NAME``.
It expects an image whose entrypoint is the agent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from anex_agent import wire
from anex_agent.coordinator import tokens
from anex_agent.coordinator.db import Conn

PROVISION_LABEL = "anex.sh/provision"
#: variables the boot credentials set; a provision's own env may not name them
RESERVED_ENV = frozenset({"ANEX_COORDINATOR_URL", "ANEX_JOIN_TOKEN", "ANEX_JOIN_TOKEN_FILE", "ANEX_PROVIDER",
                          "ANEX_NODE_NAME"})


@dataclass(frozen=True)
class BootCredentials:
    token_id: str
    env: Mapping[str, str] = field(repr=False)  # holds the secret
    onstart: str | None = None


class BootIssuer(Protocol):
    async def issue(self, tx: Conn, provision_id: str, attempt: int, *, provider: str, name: str,
                    now: float, expires_at: float) -> BootCredentials: ...


@dataclass(frozen=True)
class JoinTokenIssuer:
    """Single-use node join tokens bound to a provision (see the module docstring)."""

    coordinator_url: str

    async def issue(self, tx: Conn, provision_id: str, attempt: int, *, provider: str, name: str,
                    now: float, expires_at: float) -> BootCredentials:
        known = provider if provider in wire.Provider.__members__ else None
        request = wire.JoinTokenCreate(
            kind=wire.TokenKind.node, max_uses=1, expires_in=max(1, math.ceil(expires_at - now)),
            labels={PROVISION_LABEL: provision_id},
            providers=[wire.Provider(known)] if known else None,
        )
        created = await tokens.create(tx, request, now=now)
        env = {"ANEX_COORDINATOR_URL": self.coordinator_url, "ANEX_JOIN_TOKEN": created.token,
               "ANEX_PROVIDER": known or "other", "ANEX_NODE_NAME": name}
        return BootCredentials(created.id, env)


@dataclass(frozen=True)
class BootstrapIssuer:
    """The bootstrap's credentials (:mod:`anex_agent.coordinator.provisioning.bootstrap`: a join
    token bound to the provision in ``join_tokens``, the agent's environment), for images whose
    entrypoint is the agent."""

    coordinator_url: str

    async def issue(self, tx: Conn, provision_id: str, attempt: int, *, provider: str, name: str,
                    now: float, expires_at: float) -> BootCredentials:
        from anex_agent.coordinator.provisioning import bootstrap

        known = provider if provider in wire.Provider.__members__ else None
        made = await bootstrap.issue(tx, provision_id, expires_at=expires_at, now=now, provider=known)
        env = bootstrap.boot_env(self.coordinator_url, made.secret, provider=known or "other", node_name=name)
        return BootCredentials(made.token_id, env)


async def record(tx: Conn, token_id: str, provision_id: str, attempt: int) -> None:
    """Bind a join token to a provision's attempt (the loop calls this with what an issuer returned)."""
    await tx.execute("INSERT INTO provision_tokens (token_id, provision_id, attempt) VALUES ($1, $2, $3)",
                     token_id, provision_id, attempt)


async def joined_node(db: Conn, provision_id: str) -> dict | None:
    """The node that joined with one of the provision's tokens (the newest), or None."""
    return await db.fetchrow(
        "SELECT n.* FROM nodes n JOIN provision_tokens t ON t.token_id = n.join_token_id"
        " WHERE t.provision_id = $1 ORDER BY n.created_at DESC LIMIT 1", provision_id)
