"""The coordinator's Ed25519 key for agent API access tokens.

Where it is kept: a file, ``<state-dir>/access-token-signing-key`` by default
(``--signing-key-file``), base64 of the 32-byte private key, mode 0600. The private key
is never written to the database. The database's ``settings`` table holds the
*public* key (``agent_api_verify_key``) registered by the first coordinator; every
other coordinator on the same database must be started with a copy of the same key
file, and refuses to start (ConfigError) if its key does not match, so all
coordinators sign tokens every agent accepts.
"""

from __future__ import annotations

import base64
import binascii
import os
from pathlib import Path

from anex_agent import access_token
from anex_agent.coordinator.db import Database
from anex_agent.errors import ConfigError

SETTING = "agent_api_verify_key"


def load_or_create(path: Path) -> bytes:
    """Return the private signing key at ``path``, creating it (0600) on first use."""
    if path.exists():
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            raise ConfigError(str(path), f"signing key file has mode {mode:o}; it must be 0600 (chmod 600 {path})")
        try:
            raw = base64.b64decode(path.read_text().strip(), validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) != 32:
            raise ConfigError(str(path), "is not a base64 Ed25519 private key (32 bytes)")
        return raw
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    raw = access_token.generate_signing_key()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(base64.b64encode(raw).decode() + "\n")
    return raw


async def register(db: Database, signing_key: bytes, *, key_path: Path) -> str:
    """Record our public key in the database (first one wins); return it.

    Raises ConfigError when another coordinator registered a different key.
    """
    mine = access_token.verify_key_of(signing_key)
    async with db.transaction() as tx:
        await tx.execute("INSERT INTO settings (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING", SETTING, mine)
        registered = await tx.fetchval("SELECT value FROM settings WHERE name = $1", SETTING)
    if registered != mine:
        raise ConfigError(
            str(key_path),
            "this signing key differs from the one the other coordinators on this database use "
            f"(public key {registered}); copy their access-token-signing-key file here",
        )
    return mine
