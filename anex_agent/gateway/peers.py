"""The gateway's peer book: the set of nodes the hub serves, driven by the watch stream. Pure.

:class:`PeerBook` applies :class:`anex_agent.wire.watch.WatchEvent` s in order:

* ``snapshot``: the full set replaces what we had;
* ``peer_added``: adds the node, or replaces it (same ``node_id`` with a new key: the old
  key goes, so a re-keyed node does not leave a dangling peer);
* ``peer_removed``: removes the node (matched by ``node_id``, or by key).

Each :meth:`PeerBook.apply` returns a :class:`PeerDelta`: the engine peers to add or
replace and the public keys to remove, exactly what changed and nothing else, so the hub
applies one small change per event instead of its whole set. An event costs O(1) (a
key index is kept beside the node index); a snapshot costs O(n), once.

``version`` follows the events so that a reconnect asks for ``since=<version>``.
:meth:`PeerBook.peer_configs` gives the engine's peers (allowed IPs = the node's
addresses; no endpoint: nodes connect to the hub, and it learns their endpoint).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from anex_agent.tunnels.engines.config import PeerConfig
from anex_agent.wire.gateways import MeshPeer, PeerSet
from anex_agent.wire.watch import WatchEvent

GATEWAY_EVENT_TYPES = ("snapshot", "peer_added", "peer_removed")


def peer_config(peer: MeshPeer) -> PeerConfig:
    """The engine's peer for a node: its addresses as allowed IPs, no endpoint, no keepalive."""
    return PeerConfig(public_key=peer.public_key, endpoint=None, allowed_ips=tuple(peer.allowed_ips),
                      persistent_keepalive=0)


@dataclass(frozen=True)
class PeerDelta:
    """What one event changed in the hub's peers: ``upsert`` (set these, allowed IPs replaced)
    and ``remove`` (public keys to delete; never a key that is also upserted). Falsy when empty."""

    upsert: tuple[MeshPeer, ...] = ()
    remove: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.upsert or self.remove)

    def peer_configs(self) -> tuple[PeerConfig, ...]:
        return tuple(peer_config(p) for p in self.upsert)


@dataclass
class PeerBook:
    version: int = 0
    peers: dict[str, MeshPeer] = field(default_factory=dict)  # node_id -> peer
    _by_key: dict[str, str] = field(default_factory=dict, repr=False)  # public key -> node_id

    def __post_init__(self) -> None:
        self._reindex()

    def _reindex(self) -> None:
        self._by_key = {p.public_key: node_id for node_id, p in self.peers.items()}

    @classmethod
    def from_peer_set(cls, peer_set: PeerSet) -> PeerBook:
        return cls(version=peer_set.version, peers={p.node_id: p for p in peer_set.peers})

    def to_peer_set(self) -> PeerSet:
        return PeerSet(version=self.version, peers=sorted(self.peers.values(), key=lambda p: p.node_id))

    def has_key(self, public_key: str) -> bool:
        """Whether a node of the set holds ``public_key`` (O(1))."""
        return public_key in self._by_key

    def _drop(self, node_id: str) -> MeshPeer | None:
        peer = self.peers.pop(node_id, None)
        if peer is not None and self._by_key.get(peer.public_key) == node_id:
            del self._by_key[peer.public_key]
        return peer

    def _put(self, peer: MeshPeer) -> None:
        self.peers[peer.node_id] = peer
        self._by_key[peer.public_key] = peer.node_id

    def apply(self, event: WatchEvent) -> PeerDelta:
        """Apply one event; returns what changed (falsy when nothing). Ignores node-only events."""
        if event.type not in GATEWAY_EVENT_TYPES:
            return PeerDelta()
        if event.type == "snapshot":
            self.version = event.version  # the whole state as of its version, also when lower than ours
            return self._replace({p.node_id: p for p in (event.peers or [])})
        self.version = max(self.version, event.version)
        peer = event.peer
        if peer is None:
            return PeerDelta()
        if event.type == "peer_added":
            if self.peers.get(peer.node_id) == peer:
                return PeerDelta()
            gone: list[str] = []
            old = self._drop(peer.node_id)
            if old is not None and old.public_key != peer.public_key:
                gone.append(old.public_key)  # re-keyed node: its old key leaves the hub
            holder = self._by_key.get(peer.public_key)
            if holder is not None:
                self._drop(holder)  # a key moves to another node id: one peer per key
            self._put(peer)
            return PeerDelta(upsert=(peer,), remove=tuple(gone))
        removed: list[str] = []
        old = self._drop(peer.node_id)
        if old is not None:
            removed.append(old.public_key)
        holder = self._by_key.get(peer.public_key)
        if holder is not None:
            self._drop(holder)
            removed.append(peer.public_key)
        return PeerDelta(remove=tuple(dict.fromkeys(removed)))

    def _replace(self, peers: dict[str, MeshPeer]) -> PeerDelta:
        """The whole set becomes ``peers`` (a snapshot): the delta is the difference by public key."""
        before = {p.public_key: p for p in self.peers.values()}
        self.peers = peers
        self._reindex()
        after = {p.public_key: p for p in peers.values()}
        upsert = tuple(p for key, p in after.items() if before.get(key) is None
                       or before[key].allowed_ips != p.allowed_ips)
        remove = tuple(key for key in before if key not in after)
        return PeerDelta(upsert=upsert, remove=remove)

    def peer_configs(self) -> tuple[PeerConfig, ...]:
        return tuple(peer_config(p) for p in sorted(self.peers.values(), key=lambda p: p.node_id))
