"""A pod's files and secret variables, delivered by the cluster before the workload starts.

``ANEX_POD_FILES`` (set by the virtual node; JSON ``{"dirs": ["/ABS/DIR", ...]}``) says that the
pod has ConfigMap or Secret volumes, or variables taken from Secrets, and where its files go.
Then ``anex-agent run``:

* creates each directory (and :data:`POD_DIR`, mode 0700) before anything starts, and accepts
  pushed files (``PUT /files``, :mod:`.actions`) inside them besides ``ANEX_PUSH_DIRS``;
* holds the workload (its state stays ``waiting`` ``ContainerCreating``) until the cluster has
  pushed every file and then :data:`COMPLETE`; the virtual node pushes them through the
  coordinator once the machine has joined (``PUT /v1/nodes/{id}/files``): the coordinator passes
  them through and stores none of them;
* reads the Secret variables from :data:`ENV_FILE` (a JSON object of names to values), deletes
  the file, adds them to the workload's environment and expands ``$(NAME)`` of them in its
  command, arguments and the other variables' values, as a kubelet expands them (the virtual
  node leaves those references for the agent: the values never reach the coordinator);
* later pushes (a changed ConfigMap) replace files while the workload runs; a later
  :data:`ENV_FILE` is deleted at once (a running process's environment does not change).

:func:`parse` and :func:`prepare` raise ConfigError naming ``ANEX_POD_FILES``; neither accepts
``/`` nor a directory over or under the agent's own (its state and install directories).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from anex_agent.errors import ConfigError
from anex_agent.wire.pod import COMPLETE, ENV_FILE, POD_DIR, POD_FILES_ENV, unsafe_dir

log = logging.getLogger(__name__)

SOURCE = POD_FILES_ENV


@dataclass(frozen=True)
class Manifest:
    dirs: tuple[str, ...]


def parse(text: str | None) -> Manifest | None:
    if not text:
        return None
    try:
        raw = json.loads(text)
    except ValueError as err:
        raise ConfigError(SOURCE, f"is not JSON ({err.msg} at character {err.pos})") from None
    dirs = raw.get("dirs") if isinstance(raw, dict) else None
    if not isinstance(dirs, list) or not all(isinstance(d, str) for d in dirs):
        raise ConfigError(SOURCE, "expected {\"dirs\": [absolute directories]}")
    for entry in dirs:
        if not entry.startswith("/") or "\0" in entry or any(p in ("..", ".") for p in entry.split("/")):
            raise ConfigError(SOURCE, f"{entry!r} is not an absolute directory without '.' or '..'")
        why = unsafe_dir(entry)
        if why:
            raise ConfigError(SOURCE, f"{entry!r}: {why}")
    return Manifest(tuple(dict.fromkeys([POD_DIR, *dirs])))


def prepare(manifest: Manifest, reserved: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Create the manifest's directories; their real paths (to accept pushed files in). A directory
    over or under one of ``reserved`` (the agent's state and install directories) is refused."""
    reserved = tuple(dict.fromkeys(os.path.realpath(r) for r in reserved))
    out = []
    for entry in manifest.dirs:
        why = unsafe_dir(os.path.realpath(entry), reserved) if entry != POD_DIR else None
        if why:
            raise ConfigError(SOURCE, f"{entry!r}: {why}")
        try:
            os.makedirs(entry, mode=0o700 if entry == POD_DIR else 0o755, exist_ok=True)
        except OSError as err:
            raise ConfigError(SOURCE, f"cannot create the directory {entry}: {err.strerror or err}") from None
        out += [entry, os.path.realpath(entry)]  # the cluster names the first; a symlink above it leads to the second
    return tuple(dict.fromkeys(out))


def expand_only(text: str, env: Mapping[str, str]) -> str:
    """``$(VAR)`` of ``env``'s names replaced; everything else (``$$`` included) left as it is,
    for a text :func:`expand` has seen once already."""
    for name, value in env.items():
        text = text.replace(f"$({name})", value)
    return text


class Delivery:
    """Waits for the pod's files (see the module docstring)."""

    def __init__(self, manifest: Manifest, pod_dir: str = POD_DIR) -> None:
        self.manifest = manifest
        self.env_file = os.path.join(pod_dir, os.path.basename(ENV_FILE))
        self.complete_file = os.path.join(pod_dir, os.path.basename(COMPLETE))
        self.complete = asyncio.Event()
        self.applied = False

    def pushed(self, path: str) -> None:
        """A file was pushed (the push route's hook)."""
        if path == self.complete_file:
            self.complete.set()
        elif path == self.env_file and self.applied:
            _unlink(self.env_file)  # the workload runs: its environment cannot change any more

    async def wait(self) -> None:
        if not self.complete.is_set():
            log.info("waiting for the pod's files from the cluster before starting the workload")
        await self.complete.wait()

    def apply(self, workload) -> None:
        """The Secret variables into ``workload``'s environment and command (see the module docstring)."""
        secret: dict[str, str] = {}
        try:
            with open(self.env_file, "rb") as f:
                raw = json.loads(f.read())
            if isinstance(raw, dict):
                secret = {str(k): str(v) for k, v in raw.items()}
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as err:
            log.error("the pod's Secret variables in %s are unreadable (%s): the workload starts without them",
                      self.env_file, err)
        _unlink(self.env_file)
        _unlink(self.complete_file)
        self.applied = True
        if secret:
            env = dict(workload.env if workload.env is not None else os.environ)
            env = {k: expand_only(v, secret) for k, v in env.items()}
            env.update(secret)
            workload.env = env
            workload.argv = [expand_only(a, secret) for a in workload.argv]
        log.info("the pod's files are in place (%s)%s", ", ".join(d for d in self.manifest.dirs if d != POD_DIR)
                 or "no volume",
                 f"; {len(secret)} variable(s) from Secrets added" if secret else "")


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
