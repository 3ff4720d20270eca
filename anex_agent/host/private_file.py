"""Files that hold what only their owner may read (a credential, a key, a peer list, a database, a log).

Every file a role creates is 0600 whatever the directory's mode or the umask: written
atomically (:func:`write_private`), created or tightened in place (:func:`ensure_private`,
:func:`tighten`), or opened for appending (:func:`open_private_append`). Shared by the agent's
state directory and logs, the gateway's state file and the coordinator's SQLite database.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temp file + fsync + rename) with mode 0600.

    A reader sees the old content or the new, never a part; the temp file never outlives a failure."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def ensure_private(path: Path) -> None:
    """Make ``path`` a file only its owner may read or write, whatever the directory's mode or the umask.

    A missing file is created empty with mode 0600 (SQLite takes an empty file for a new
    database, and creates its ``-wal``, ``-shm`` and journal files with the database file's
    mode); an existing one that others may read is made 0600. A symbolic link is refused
    (OSError), as for every private file here."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def tighten(path: Path) -> None:
    """An existing ``path`` that others may read is made 0600; a missing one is left missing."""
    try:
        mode = os.stat(path, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return
    if mode & 0o077:
        os.chmod(path, 0o600, follow_symlinks=False)


def open_private_append(path: Path):
    """``path`` opened for appending bytes, unbuffered, created 0600 (an existing one made 0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, 0o600)
        return os.fdopen(fd, "ab", buffering=0)
    except BaseException:
        os.close(fd)
        raise
