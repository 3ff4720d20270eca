"""The coordinator's static X25519 key, against which nodes and gateways prove key possession.

Where it is kept: ``<state-dir>/coordinator-key``, base64 of the 32-byte private key, mode
0600, created on first start. The private key is never written to the database. The
``settings`` table holds the *public* key (``coordinator_public_key``) registered by the
first coordinator; every other coordinator on the same database must be started with a
copy of the same file, and refuses to start (ConfigError naming the file) if its key does
not match, so a proof made for one coordinator is good at all of them.
"""

from __future__ import annotations

import base64
import binascii
import os
from pathlib import Path

from anex_agent import keys
from anex_agent.coordinator.db import Database
from anex_agent.errors import ConfigError

SETTING = "coordinator_public_key"
FILE_NAME = "coordinator-key"


def load_or_create(path: Path) -> bytes:
    """Return the private key at ``path``, creating it (0600) on first use."""
    if path.exists():
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            raise ConfigError(str(path), f"coordinator key file has mode {mode:o}; it must be 0600 (chmod 600 {path})")
        try:
            raw = base64.b64decode(path.read_text().strip(), validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) != keys.KEY_LEN:
            raise ConfigError(str(path), "is not a base64 X25519 private key (32 bytes)")
        return raw
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    raw = keys.generate_private_key()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(base64.b64encode(raw).decode() + "\n")
    return raw


async def register(db: Database, private: bytes, *, key_path: Path) -> str:
    """Record our public key in the database (first one wins); return it (base64).

    Raises ConfigError when another coordinator registered a different key.
    """
    mine = keys.encode_key(keys.public_key(private))
    async with db.transaction() as tx:
        await tx.execute("INSERT INTO settings (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING", SETTING, mine)
        registered = await tx.fetchval("SELECT value FROM settings WHERE name = $1", SETTING)
    if registered != mine:
        raise ConfigError(
            str(key_path),
            "this coordinator key differs from the one the other coordinators on this database use "
            f"(public key {registered}); copy their {FILE_NAME} file here",
        )
    return mine
