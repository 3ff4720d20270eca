"""The gateway's peer book: the set of nodes the hub serves, driven by the watch stream. Pure.

:class:`PeerBook` applies :class:`anex_agent.wire.WatchEvent` s in order:

* ``snapshot``: the full set replaces what we had;
* ``peer_added``: adds the node, or replaces it (same ``node_id`` with a new key: the old
  key goes, so a re-keyed node does not leave a dangling peer);
* ``peer_removed``: removes the node (matched by ``node_id``, or by key).

``version`` follows the events so that a reconnect asks for ``since=<version>``.
:meth:`PeerBook.peer_configs` gives the engine's peers (allowed IPs = the node's
addresses; no endpoint: nodes connect to the hub, and it learns their endpoint).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from anex_agent.tunnels.base import PeerConfig
from anex_agent.wire import MeshPeer, PeerSet, WatchEvent

GATEWAY_EVENT_TYPES = ("snapshot", "peer_added", "peer_removed")


@dataclass
class PeerBook:
    version: int = 0
    peers: dict[str, MeshPeer] = field(default_factory=dict)  # node_id -> peer

    @classmethod
    def from_peer_set(cls, peer_set: PeerSet) -> PeerBook:
        return cls(version=peer_set.version, peers={p.node_id: p for p in peer_set.peers})

    def to_peer_set(self) -> PeerSet:
        return PeerSet(version=self.version, peers=sorted(self.peers.values(), key=lambda p: p.node_id))

    def apply(self, event: WatchEvent) -> bool:
        """Apply one event; returns whether the peer set changed. Ignores node-only events."""
        if event.type not in GATEWAY_EVENT_TYPES:
            return False
        before = dict(self.peers)
        if event.type == "snapshot":
            self.peers = {p.node_id: p for p in (event.peers or [])}
        elif event.type == "peer_added" and event.peer is not None:
            for node_id, peer in list(self.peers.items()):
                if peer.public_key == event.peer.public_key and node_id != event.peer.node_id:
                    del self.peers[node_id]  # a key moves to another node id: one peer per key
            self.peers[event.peer.node_id] = event.peer
        elif event.type == "peer_removed" and event.peer is not None:
            self.peers.pop(event.peer.node_id, None)
            for node_id, peer in list(self.peers.items()):
                if peer.public_key == event.peer.public_key:
                    del self.peers[node_id]
        self.version = max(self.version, event.version)
        return self.peers != before

    def peer_configs(self) -> tuple[PeerConfig, ...]:
        return tuple(
            PeerConfig(public_key=p.public_key, endpoint=None, allowed_ips=tuple(p.allowed_ips), persistent_keepalive=0)
            for p in sorted(self.peers.values(), key=lambda p: p.node_id)
        )
