"""Secrets the coordinator hands out: join tokens, node/gateway credentials, the admin token.

Contract:
* A secret is ``<prefix>_<43 characters of url-safe base64>`` (256 random bits from
  :func:`secrets.token_urlsafe`); the prefix says what it is (``anexjt`` join token,
  ``anexnc`` node credential, ``anexgc`` gateway credential, ``anexadm`` admin token)
  so a leaked one is recognisable by secret scanners.
* Only :func:`hash_secret` (SHA-256, hex) is ever stored. Lookups go by hash; where a
  secret is compared directly (the admin token) :func:`same_secret` is constant-time.
  A plain hash, not a slow key-derivation function, is right here: every secret carries
  256 random bits, so there is nothing to guess, and a check costs about a microsecond
  (a KDF would cost milliseconds per heartbeat). :func:`digest` is the same hash as 32
  raw bytes, the compact form the in-memory credential cache keys on.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
from pathlib import Path

from anex_agent.errors import ConfigError

log = logging.getLogger(__name__)

JOIN_TOKEN = "anexjt"
NODE_CREDENTIAL = "anexnc"
GATEWAY_CREDENTIAL = "anexgc"
ADMIN_TOKEN = "anexadm"

_ENTROPY_BYTES = 32


def new_secret(prefix: str) -> str:
    """Return a fresh random secret with ``prefix``."""
    return f"{prefix}_{secrets.token_urlsafe(_ENTROPY_BYTES)}"


def new_id(prefix: str) -> str:
    """Return a short random public identifier, e.g. ``n-3f9a0c1b2d4e``."""
    return f"{prefix}-{secrets.token_hex(6)}"


def hash_secret(secret: str) -> str:
    """The only form in which a secret is stored."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def digest(secret: str) -> bytes:
    """:func:`hash_secret` as 32 raw bytes (``digest(s).hex() == hash_secret(s)``)."""
    return hashlib.sha256(secret.encode("utf-8")).digest()


def has_prefix(secret: str, prefix: str) -> bool:
    return secret.startswith(prefix + "_")


def same_secret(a: str, b: str) -> bool:
    """Constant-time comparison of two secrets."""
    return hmac.compare_digest(a.encode("utf-8"), b.encode("utf-8"))


def load_admin_token(state_dir: Path, environ: dict[str, str] | None = None) -> tuple[str, str]:
    """Return ``(token, where)``: ``ANEX_ADMIN_TOKEN`` if set, else ``<state_dir>/admin-token``.

    The file is created on first use with mode 0600; a file readable by group or
    others is refused (ConfigError), as is an empty one.
    """
    env = os.environ if environ is None else environ
    token = env.get("ANEX_ADMIN_TOKEN", "").strip()
    if token:
        if len(token) < 16:
            raise ConfigError("ANEX_ADMIN_TOKEN", "is too short; use at least 16 random characters")
        return token, "the ANEX_ADMIN_TOKEN environment variable"
    path = state_dir / "admin-token"
    if path.exists():
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            raise ConfigError(str(path), f"admin token file has mode {mode:o}; it must be 0600 (chmod 600 {path})")
        token = path.read_text().strip()
        if not token:
            raise ConfigError(str(path), "is empty; delete it to generate a new admin token")
        return token, str(path)
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = new_secret(ADMIN_TOKEN)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    return token, str(path)


async def rotate(db, table: str, ident: str, used_hash: str, *, current: bool, now: float, grace: float) -> str | None:
    """Give the node or gateway ``ident`` a new credential; return it, or None when nothing changed.

    ``used_hash`` is the hash of the credential the caller presented. With its current one
    (``current``), that one becomes the previous credential, good until ``now + grace``.
    With its previous one, within the grace (the answer carrying the new one was lost),
    the current one is replaced again and the grace deadline stays. A ``credentials``
    change tells every coordinator's cache. None when the row changed meanwhile (a
    concurrent rotation, a re-join, a deletion).
    """
    from anex_agent.coordinator import changes  # late: changes -> db only, but keep this module import-light

    assert table in ("nodes", "gateways")
    secret = new_secret(NODE_CREDENTIAL if table == "nodes" else GATEWAY_CREDENTIAL)
    async with db.transaction() as tx:
        if current:
            changed = await tx.execute(
                f"UPDATE {table} SET previous_credential_hash = credential_hash, previous_valid_until = $3,"
                " credential_hash = $4, credential_issued_at = $5 WHERE id = $1 AND credential_hash = $2",
                ident, used_hash, now + grace, hash_secret(secret), now,
            )
        else:
            changed = await tx.execute(
                f"UPDATE {table} SET credential_hash = $3, credential_issued_at = $4"
                " WHERE id = $1 AND previous_credential_hash = $2 AND previous_valid_until > $4",
                ident, used_hash, hash_secret(secret), now,
            )
        if changed != 1:
            return None
        await changes.append(db, tx, changes.Scope.CREDENTIAL_CACHES, changes.ChangeType.ROTATED, target=ident, now=now)
    log.info("rotated the credential of %s", ident)
    return secret


async def end_grace(db, table: str, ident: str, current_hash: str, *, now: float) -> bool:
    """The caller has shown it holds its new credential: the previous one stops now, not at the
    end of its grace. True when that changed something (a ``credentials`` change then tells
    every coordinator's cache)."""
    from anex_agent.coordinator import changes

    assert table in ("nodes", "gateways")
    async with db.transaction() as tx:
        changed = await tx.execute(
            f"UPDATE {table} SET previous_valid_until = $3"
            " WHERE id = $1 AND credential_hash = $2 AND previous_valid_until > $3",
            ident, current_hash, now,
        )
        if changed != 1:
            return False
        await changes.append(db, tx, changes.Scope.CREDENTIAL_CACHES, changes.ChangeType.GRACE_ENDED, target=ident, now=now)
    return True
