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

from pathlib import Path

from anex_agent.wire import access_token
from anex_agent.coordinator import key_file as registered_key
from anex_agent.coordinator.db import Database

SETTING = "agent_api_verify_key"
FILE_NAME = "access-token-signing-key"

KIND = registered_key.RegisteredKey(
    label="signing key",
    algorithm="Ed25519",
    setting=SETTING,
    file_name=FILE_NAME,
    generate=access_token.generate_signing_key,
    public_of=access_token.verify_key_of,
)


def load_or_create(path: Path) -> bytes:
    """Return the private signing key at ``path``, creating it (0600) on first use."""
    return registered_key.load_or_create(KIND, path)


async def register(db: Database, signing_key: bytes, *, key_path: Path) -> str:
    """Record our public key in the database (first one wins); return it.

    Raises ConfigError when another coordinator registered a different key.
    """
    return await registered_key.register(KIND, db, signing_key, key_path=key_path)
