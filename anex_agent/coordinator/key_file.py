"""A coordinator private key kept in a 0600 file, whose public key every coordinator on one
database must share.

Contract:

* :func:`load_or_create` returns the 32-byte private key stored base64 in the file, creating
  the file (mode 0600, parent directory 0700) on first use. A file readable by group or
  others, or one that does not hold 32 base64-encoded bytes, is a ConfigError naming the file.
* :func:`register` records the public key in the ``settings`` table under the kind's setting
  name when none is there yet (the first coordinator wins) and returns the registered value.
  A different key already registered is a ConfigError naming the key file: every coordinator
  on one database must be started with a copy of the same file.

The private key is never written to the database. Each key (its file name, algorithm,
setting, generator) is described once by a :class:`RegisteredKey`.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from anex_agent.coordinator.db import Database
from anex_agent.errors import ConfigError

KEY_LEN = 32


@dataclass(frozen=True)
class RegisteredKey:
    """What differs between the coordinator's registered keys."""

    label: str  # "coordinator key": how errors name it
    algorithm: str  # "X25519": how errors name the expected content
    setting: str  # name of the row in the ``settings`` table that holds the public key
    file_name: str  # the default file name, which errors tell the operator to copy
    generate: Callable[[], bytes]  # a fresh 32-byte private key
    public_of: Callable[[bytes], str]  # the public key (as stored in ``settings``) of a private key


def load_or_create(kind: RegisteredKey, path: Path) -> bytes:
    """Return the private key at ``path``, creating it (0600) on first use."""
    if path.exists():
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            raise ConfigError(str(path), f"{kind.label} file has mode {mode:o}; it must be 0600 (chmod 600 {path})")
        try:
            raw = base64.b64decode(path.read_text().strip(), validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) != KEY_LEN:
            raise ConfigError(str(path), f"is not a base64 {kind.algorithm} private key ({KEY_LEN} bytes)")
        return raw
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    raw = kind.generate()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(base64.b64encode(raw).decode() + "\n")
    return raw


async def register(kind: RegisteredKey, db: Database, private: bytes, *, key_path: Path) -> str:
    """Record the public key of ``private`` in the database (first one wins); return it.

    Raises ConfigError naming ``key_path`` when another coordinator registered a different key.
    """
    mine = kind.public_of(private)
    async with db.transaction() as tx:
        await tx.execute("INSERT INTO settings (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
                         kind.setting, mine)
        registered = await tx.fetchval("SELECT value FROM settings WHERE name = $1", kind.setting)
    if registered != mine:
        raise ConfigError(
            str(key_path),
            f"this {kind.label} differs from the one the other coordinators on this database use "
            f"(public key {registered}); copy their {kind.file_name} file here",
        )
    return mine
