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
* for a pod with variables from Secrets, reads :data:`ENV_FILE` (every variable of the container
  in order, ``[[NAME, VALUE, TEMPLATE], ...]``), deletes the file, defines the variables as a
  kubelet does (:func:`anex_agent.wire.pod.resolve`: a template expanded once against the variables
  before it), adds them to the workload's environment and expands ``$(NAME)`` of them, once, in
  its command and arguments, which the virtual node left as written (the values never reach the
  coordinator); the agent's own environment is never expanded into;
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
from dataclasses import dataclass

from anex_agent.errors import ConfigError
from anex_agent.wire.pod import COMPLETE, ENV_FILE, POD_DIR, POD_FILES_ENV, expand, resolve, unsafe_dir

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


def _variables(raw: object) -> list[tuple[str, str, bool]] | None:
    if not isinstance(raw, list) or not all(
            isinstance(e, list) and len(e) == 3 and isinstance(e[0], str) and isinstance(e[1], str)
            and isinstance(e[2], bool) for e in raw):
        return None
    return [(name, value, template) for name, value, template in raw]


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
        variables: list[tuple[str, str, bool]] | None = None
        try:
            with open(self.env_file, "rb") as f:
                variables = _variables(json.loads(f.read()))
            if variables is None:
                log.error("the pod's variables in %s are not [[NAME, VALUE, TEMPLATE], ...]: the workload starts "
                          "without them", self.env_file)
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as err:
            log.error("the pod's variables in %s are unreadable (%s): the workload starts without them",
                      self.env_file, err)
        _unlink(self.env_file)
        _unlink(self.complete_file)
        self.applied = True
        container: dict[str, str] = {}
        if variables is not None:
            container = resolve(variables)
            env = dict(workload.env if workload.env is not None else os.environ)
            env.update(container)
            workload.env = env
            workload.argv = [expand(a, container) for a in workload.argv]
        log.info("the pod's files are in place (%s)%s", ", ".join(d for d in self.manifest.dirs if d != POD_DIR)
                 or "no volume",
                 f"; {len(container)} variable(s) defined" if container else "")


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
