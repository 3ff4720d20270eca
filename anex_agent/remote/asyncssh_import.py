"""Importing asyncssh without its start-up probes for liboqs (docs/remote-access.md, "Figures").

asyncssh's post-quantum module looks for liboqs (for the ``sntrup761x25519`` key exchange) with
:func:`ctypes.util.find_library` as it is imported. On Linux that runs ``ldconfig -p`` and,
for a library it does not find there, ``gcc`` and ``ld``: for two names, four to six processes,
a large part of ``anex-agent ssh NODE -- true`` on a loaded machine, and of the agent's first
SSH connection.

Contract: :func:`load` returns the ``asyncssh`` module. On its first import it lets asyncssh
find liboqs with :func:`find_library` instead, which runs no process: it looks for
``lib<name>.so*`` where the dynamic loader looks (``LD_LIBRARY_PATH`` from ``environ``, the
directories of ``/etc/ld.so.conf`` and its includes, the default library directories).
liboqs installed anywhere the loader would load it from is still found and used; nothing
about the algorithms offered changes otherwise (ML-KEM comes from ``cryptography``, not
liboqs). Thread-unsafe only in that :func:`ctypes.util.find_library` is swapped for the
duration of the import.
"""

from __future__ import annotations

import glob
import os
import sys
from collections.abc import Iterator, Mapping
from types import ModuleType

DEFAULT_DIRS = ("/lib", "/usr/lib", "/lib64", "/usr/lib64", "/usr/local/lib", "/usr/local/lib64")
LD_SO_CONF = "/etc/ld.so.conf"


def _conf_dirs(path: str, depth: int = 0) -> Iterator[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("include ") and depth < 4:
            pattern = line.split(None, 1)[1]
            if not os.path.isabs(pattern):
                pattern = os.path.join(os.path.dirname(path), pattern)
            for included in sorted(glob.glob(pattern)):
                yield from _conf_dirs(included, depth + 1)
        elif line.startswith("/"):
            yield line


def library_dirs(environ: Mapping[str, str], conf: str = LD_SO_CONF) -> list[str]:
    """Where the dynamic loader looks, in its order, without duplicates."""
    found: list[str] = []
    for where in (*environ.get("LD_LIBRARY_PATH", "").split(":"), *_conf_dirs(conf), *DEFAULT_DIRS):
        if where and where not in found:
            found.append(where)
    return found


def find_library(name: str, dirs: list[str]) -> str | None:
    """The path of ``lib<name>.so`` (or a versioned ``lib<name>.so.N``) in ``dirs``, or None."""
    stem = name if name.startswith("lib") else f"lib{name}"
    for where in dirs:
        plain = os.path.join(where, f"{stem}.so")
        if os.path.exists(plain):
            return plain
        versioned = sorted(glob.glob(os.path.join(glob.escape(where), f"{stem}.so.*")))
        if versioned:
            return versioned[0]
    return None


def load(environ: Mapping[str, str] | None = None) -> ModuleType:
    """The asyncssh module, imported without process-spawning library probes (see above)."""
    module = sys.modules.get("asyncssh")
    if module is not None:
        return module
    import ctypes.util

    dirs = library_dirs(os.environ if environ is None else environ)
    original = ctypes.util.find_library
    ctypes.util.find_library = lambda name: find_library(name, dirs)
    try:
        import asyncssh
    finally:
        ctypes.util.find_library = original
    return asyncssh
