"""The gateway's state dir: key pair, registration and peer set, kept so that a gateway
restarted while the coordinator is down starts from what it had (fail static).

Files (mode 0600, in a 0700 directory):

* ``private.key``: the WireGuard key pair (only the public key leaves the gateway);
* ``gateway.json``: the registration (it holds the credential), a snapshot of the peer set,
  and the id of the journal that continues it;
* ``peers.journal``: the watch events applied since that snapshot, one JSON line each,
  after a header line ``{"journal": ID}``.

Cost: a change costs one line, whatever the size of the set: the event loop queues it
(:meth:`GatewayState.record`, no I/O, never waiting on a write) and a writer thread appends
what is queued (:meth:`GatewayState.flush`). The whole set is rewritten only by
:meth:`GatewayState.save`: at start, after a snapshot event or a new registration, and when
the journal has more lines than ``max(JOURNAL_MIN, peers)`` (:meth:`GatewayState.journal_full`),
so a rewrite of n peers comes at most once per n changes. Before the journal, every change
rewrote the whole set (1.5 MB, about 7 ms of CPU and an fsync at 10,000 peers) on every
gateway at once.

Order: events carry sequence numbers; writes happen under one lock, so the journal holds
them in the order applied whichever thread writes. A rewrite names the last event its copy
of the set includes (``through``): later events stay queued for the new journal, and a
rewrite whose copy is older than what a flush already wrote is refused (the caller retries
with a fresher copy), so nothing written is ever lost by a rewrite.

Crash safety: ``gateway.json`` is replaced atomically (temp file, fsync, rename), then a
fresh journal is put in place the same way with the snapshot's new id. A journal whose
header names another id is one the snapshot already includes (the gateway stopped between
the two renames) and is not replayed. Appends are fsynced; a torn last line (the gateway
killed while appending) ends the replay there. :meth:`GatewayState.load` replays the
journal through :class:`~anex_agent.gateway.peers.PeerBook`, the same code that applied the
events, so the result is the set the gateway had.
"""

from __future__ import annotations

import collections
import ipaddress
import json
import logging
import os
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

from anex_agent.wire import keys
from anex_agent.gateway.peers import GATEWAY_EVENT_TYPES, PeerBook
from anex_agent.host.private_file import write_private
from anex_agent.wire.gateways import MeshPeer, PeerSet
from anex_agent.wire.reader import read
from anex_agent.wire.watch import WatchEvent

log = logging.getLogger(__name__)

STATE_FILE = "gateway.json"
JOURNAL_FILE = "peers.journal"
KEY_FILE = "private.key"
#: The journal may always grow to this many lines before the whole set is rewritten.
JOURNAL_MIN = 1000


@dataclass
class Registration:
    """What registration gave us, saved to the state dir (0600; holds the credential)."""

    coordinator_url: str
    gateway_id: str
    credential: str
    address: str
    network: str
    mtu: int

    def __repr__(self) -> str:
        return f"Registration(gateway_id={self.gateway_id!r}, address={self.address!r})"

    @property
    def interface_address(self) -> str:
        return f"{self.address}/{ipaddress.ip_network(self.network, strict=False).prefixlen}"


def event_line(event: WatchEvent) -> str:
    """One journal line for a gateway event (``peer_added`` / ``peer_removed``)."""
    if event.type not in GATEWAY_EVENT_TYPES or event.type == "snapshot" or event.peer is None:
        raise ValueError(f"only peer_added and peer_removed events are journaled, not {event.type!r}")
    return json.dumps({"type": event.type, "version": event.version,
                       "peer": event.peer.model_dump(mode="json")}, separators=(",", ":"))


class GatewayState:
    """The state dir. :meth:`save` and :meth:`append` are safe to call from a thread (one
    lock orders them); :meth:`load` is for the start."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._fragments: dict[str, tuple[MeshPeer, str]] = {}  # node id -> (peer, its JSON)
        self.journal_id = ""  # of the journal continuing the last snapshot written or read
        self.journal_lines = 0  # events in that journal
        self.recorded = 0  # sequence number of the last event recorded (counts from this process's start)
        self._flushed = 0  # sequence number of the last event written (journal or snapshot)
        # (seq, line) recorded, not written yet; the loop appends, the writer (under _lock) pops
        self._pending: collections.deque[tuple[int, str]] = collections.deque()

    def ensure(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True, mode=0o700)

    def keypair(self) -> keys.KeyPair:
        return keys.load_or_create(self.path / KEY_FILE)

    # ------------------------------------------------------------ reading

    def load(self, coordinator_url: str) -> tuple[Registration, PeerSet] | None:
        """The saved registration and peer set (snapshot plus journal), or None when there is
        none, it is unreadable, or it belongs to another coordinator."""
        try:
            doc = json.loads((self.path / STATE_FILE).read_text())
        except (OSError, ValueError):
            return None
        saved = doc.get("registration") if isinstance(doc, dict) else None
        if not isinstance(saved, dict) or saved.get("coordinator_url") != coordinator_url:
            return None  # another coordinator (or nothing readable): not ours to reuse
        try:
            registration, snapshot = Registration(**saved), read(PeerSet, doc["peers"])
        except (TypeError, KeyError, ValueError):
            log.warning("ignoring unreadable %s", self.path / STATE_FILE)
            return None
        book = PeerBook.from_peer_set(snapshot)
        self.journal_id = str(doc.get("journal", ""))
        self.journal_lines = self._replay(book) if self.journal_id else 0
        return registration, book.to_peer_set()

    def _replay(self, book: PeerBook) -> int:
        """Apply the journal of :attr:`journal_id` to ``book``; the number of events applied."""
        path = self.path / JOURNAL_FILE
        try:
            lines = path.read_bytes().split(b"\n")
        except OSError:
            return 0
        try:
            header = json.loads(lines[0])
        except ValueError:
            header = None
        if not isinstance(header, dict) or header.get("journal") != self.journal_id:
            return 0  # a journal the snapshot already includes
        applied = 0
        for number, line in enumerate(lines[1:], start=2):
            if not line:
                continue
            try:
                event = read(WatchEvent, line)
            except ValueError:
                log.warning("%s: line %d is incomplete or unreadable; %d changes after the snapshot "
                            "replayed, the rest comes from the coordinator", path, number, applied)
                self.journal_id = ""  # nothing is appended after a torn line: the next write is a whole save
                break
            book.apply(event)
            applied += 1
        return applied

    # ------------------------------------------------------------ writing

    def record(self, event: WatchEvent) -> int:
        """Queue ``event`` (just applied to the peer book) for the journal; its sequence number.
        Call from one thread only (the event loop); it never waits for a write in progress."""
        self.recorded += 1
        self._pending.append((self.recorded, event_line(event)))
        return self.recorded

    def flush(self) -> int:
        """Append every queued event to the journal, in the order recorded, and fsync; the
        number written. Writes nothing before a :meth:`save` or :meth:`load` gave the journal
        its snapshot (:attr:`journal_id`). Safe in a thread."""
        with self._lock:
            if not self.journal_id:
                return 0  # no snapshot to continue yet: the caller saves the whole set
            batch = []
            while self._pending:
                batch.append(self._pending.popleft())
            if not batch:
                return 0
            data = memoryview("".join(line + "\n" for _, line in batch).encode())
            fd = os.open(self.path / JOURNAL_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                while data:
                    data = data[os.write(fd, data):]
                os.fsync(fd)
            finally:
                os.close(fd)
            self._flushed = batch[-1][0]
            self.journal_lines += len(batch)
            return len(batch)

    def save(self, registration: Registration, peers: PeerSet, through: int | None = None) -> bool:
        """Write the registration and the whole peer set (sorted by node id), then start a new
        journal after it. ``peers`` is the set after the event recorded as ``through`` (default:
        the last one recorded); later events stay queued for the new journal. Returns False,
        writing nothing, when an event after ``through`` is already in the journal (a copy
        taken before a flush that went first): the caller saves a fresher copy later.

        Each peer's JSON is kept from one save to the next (peers are immutable), so a save
        of 10,000 peers encodes only those that changed. Safe in a thread."""
        through = self.recorded if through is None else through
        with self._lock:
            if self._flushed > through:
                return False
            fragments: dict[str, tuple[MeshPeer, str]] = {}
            texts = []
            for peer in sorted(peers.peers, key=lambda p: p.node_id):
                cached = self._fragments.get(peer.node_id)
                if cached is None or cached[0] is not peer:
                    cached = (peer, json.dumps(peer.model_dump(mode="json")))
                fragments[peer.node_id] = cached
                texts.append(cached[1])
            self._fragments = fragments
            journal_id = secrets.token_hex(8)
            text = (f'{{"registration": {json.dumps(registration.__dict__)},\n"journal": "{journal_id}",\n'
                    f'"peers": {{"version": {peers.version}, "peers": [\n' + ",\n".join(texts) + "]}}\n")
            write_private(self.path / STATE_FILE, text)
            write_private(self.path / JOURNAL_FILE, json.dumps({"journal": journal_id}) + "\n")
            while self._pending and self._pending[0][0] <= through:
                self._pending.popleft()  # in the snapshot
            self.journal_id, self.journal_lines, self._flushed = journal_id, 0, through
            return True

    def journal_full(self, peer_count: int) -> bool:
        """Whether the next save should rewrite the whole set (the journal outgrew it)."""
        return self.journal_lines >= max(JOURNAL_MIN, peer_count)
