"""The coordinator's static X25519 key, against which nodes and gateways prove key possession.

Where it is kept: ``<state-dir>/coordinator-key``, base64 of the 32-byte private key, mode
0600, created on first start. The private key is never written to the database. The
``settings`` table holds the *public* key (``coordinator_public_key``) registered by the
first coordinator; every other coordinator on the same database must be started with a
copy of the same file, and refuses to start (ConfigError naming the file) if its key does
not match, so a proof made for one coordinator is good at all of them.
"""

from __future__ import annotations

from pathlib import Path

from anex_agent.wire import keys
from anex_agent.coordinator import key_file as registered_key
from anex_agent.coordinator.db import Database

SETTING = "coordinator_public_key"
FILE_NAME = "coordinator-key"

KIND = registered_key.RegisteredKey(
    label="coordinator key",
    algorithm="X25519",
    setting=SETTING,
    file_name=FILE_NAME,
    generate=keys.generate_private_key,
    public_of=lambda private: keys.encode_key(keys.public_key(private)),
)


def load_or_create(path: Path) -> bytes:
    """Return the private key at ``path``, creating it (0600) on first use."""
    return registered_key.load_or_create(KIND, path)


async def register(db: Database, private: bytes, *, key_path: Path) -> str:
    """Record our public key in the database (first one wins); return it (base64).

    Raises ConfigError when another coordinator registered a different key.
    """
    return await registered_key.register(KIND, db, private, key_path=key_path)
