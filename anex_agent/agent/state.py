"""The agent's state directory: identity, node credential and the last good config.

Layout (directory 0700, every file 0600, written atomically: temp file + rename)::

    <state_dir>/private.key        WireGuard private key (keys.load_or_create); never leaves the node
    <state_dir>/node.json          {"coordinator_url", "node_id", "credential"} from the join
    <state_dir>/last-config.json   the last NodeConfig the coordinator sent (fail-static start)

Contract: a restart with the same state dir re-uses the key and the credential, so it
does not join again (the join token may be single-use); with the coordinator down it
can bring the data plane up from ``last-config.json``.

Permissions are checked whenever the directory is used (:meth:`StateDir.ensure`): a
directory owned by another user is refused (ConfigError naming ANEX_STATE_DIR); a
directory or one of the files above that group or others may access is set back to
0700/0600 with a warning naming it. So a workload running as another user (``--user``)
cannot read the key or the credential.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from anex_agent.wire import keys
from anex_agent.errors import ConfigError
from anex_agent.host.private_file import write_private
from anex_agent.wire.nodes import NodeConfig
from anex_agent.wire.reader import read

KEY_FILE = "private.key"
NODE_FILE = "node.json"
CONFIG_FILE = "last-config.json"
SECRET_FILES = (KEY_FILE, NODE_FILE, CONFIG_FILE)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeIdentity:
    """What the join bought: who we are at which coordinator. ``credential`` is a secret."""

    coordinator_url: str
    node_id: str
    credential: str

    def __repr__(self) -> str:  # never print the credential
        return f"NodeIdentity(coordinator_url={self.coordinator_url!r}, node_id={self.node_id!r})"


class StateDir:
    """Typed access to the files of one state directory (created 0700 on first use)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def ensure(self) -> None:
        try:
            self.path.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as err:
            raise ConfigError("ANEX_STATE_DIR", f"cannot create {self.path}: {err.strerror}; expected a writable directory") from None
        if not os.access(self.path, os.W_OK):
            raise ConfigError("ANEX_STATE_DIR", f"{self.path} is not writable; expected a writable directory")
        self.secure()

    def secure(self, euid: int | None = None) -> None:
        """Refuse a directory of another user; make a group/world-accessible one private again."""
        euid = os.geteuid() if euid is None else euid
        info = os.stat(self.path)
        if info.st_uid != euid:
            raise ConfigError(
                "ANEX_STATE_DIR", f"{self.path} belongs to uid {info.st_uid}, not to the agent's user (uid {euid}); "
                "it holds the node's private key and credential: chown it to the agent's user or choose another directory"
            )
        if stat.S_IMODE(info.st_mode) & 0o077:
            os.chmod(self.path, 0o700)
            log.warning("state dir %s was mode %04o (other users could enter it); set to 0700",
                        self.path, stat.S_IMODE(info.st_mode))
        for name in SECRET_FILES:
            path = self.path / name
            try:
                mode = stat.S_IMODE(os.lstat(path).st_mode)
            except FileNotFoundError:
                continue
            if mode & 0o077 and not path.is_symlink():
                os.chmod(path, 0o600)
                log.warning("%s was mode %04o (other users could read it); set to 0600", path, mode)

    def keypair(self) -> keys.KeyPair:
        self.ensure()
        return keys.load_or_create(self.path / KEY_FILE)

    # ---------------------------------------------------------------- identity

    def load_identity(self, coordinator_url: str) -> NodeIdentity | None:
        """The saved identity, or None when absent or joined at a different coordinator."""
        path = self.path / NODE_FILE
        if not path.exists():
            return None
        try:
            data = json.loads(path.read_text())
            ident = NodeIdentity(str(data["coordinator_url"]), str(data["node_id"]), str(data["credential"]))
        except (ValueError, KeyError, TypeError):
            raise ConfigError(str(path), "is not a node identity written by anex-agent; delete it to join again") from None
        if coordinator_url and ident.coordinator_url != coordinator_url:
            return None
        return ident

    def save_identity(self, ident: NodeIdentity) -> None:
        self.ensure()
        data = {"coordinator_url": ident.coordinator_url, "node_id": ident.node_id, "credential": ident.credential}
        write_private(self.path / NODE_FILE, json.dumps(data, indent=2) + "\n")

    def forget_identity(self) -> None:
        """Drop the identity and config (the coordinator no longer knows us: join again)."""
        (self.path / NODE_FILE).unlink(missing_ok=True)
        (self.path / CONFIG_FILE).unlink(missing_ok=True)

    # ---------------------------------------------------------------- last good config

    def load_config(self) -> NodeConfig | None:
        path = self.path / CONFIG_FILE
        if not path.exists():
            return None
        try:
            return read(NodeConfig, path.read_text())
        except (ValidationError, ValueError):
            return None  # a config we cannot read is as good as none: the coordinator will send one

    def save_config(self, config: NodeConfig) -> None:
        self.ensure()
        write_private(self.path / CONFIG_FILE, config.model_dump_json(indent=2) + "\n")
