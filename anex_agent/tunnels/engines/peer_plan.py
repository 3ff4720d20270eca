"""The peer diff: what to add, update and remove to go from the peers an engine has to the ones wanted.

Pure (no I/O): :func:`plan_peers` compares two lists of
:class:`~anex_agent.tunnels.engines.config.PeerConfig` by public key, so that an engine's
``apply()`` touches only the peers that changed and a peer whose config did not change keeps its
session. A desired endpoint of None keeps the endpoint the peer roamed to.
"""

from __future__ import annotations

from dataclasses import dataclass

from anex_agent.tunnels.engines.config import PeerConfig


@dataclass(frozen=True)
class PeerPlan:
    """What to change to go from the current peers to the desired ones.

    ``add``: peers to create; ``update``: peers that exist but differ (the whole desired
    peer is given; engines replace allowed IPs and set endpoint/keepalive/psk);
    ``remove``: public keys to delete. Empty plan == nothing to do.
    """

    add: tuple[PeerConfig, ...] = ()
    update: tuple[PeerConfig, ...] = ()
    remove: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.add or self.update or self.remove)


def _same_peer(current: PeerConfig, desired: PeerConfig) -> bool:
    # A desired endpoint of None means "learn it from the peer": do not reset a roamed endpoint.
    endpoint_ok = desired.endpoint is None or current.endpoint == desired.endpoint
    return (
        endpoint_ok
        and current.allowed_set() == desired.allowed_set()
        and current.persistent_keepalive == desired.persistent_keepalive
        and (current.preshared_key or None) == (desired.preshared_key or None)
    )


def plan_peers(current: tuple[PeerConfig, ...] | list[PeerConfig], desired: tuple[PeerConfig, ...]) -> PeerPlan:
    """Diff two peer lists by public key. Pure; the result is in a stable (desired) order."""
    have = {p.public_key: p for p in current}
    want = {p.public_key: p for p in desired}
    add = tuple(p for k, p in want.items() if k not in have)
    update = tuple(p for k, p in want.items() if k in have and not _same_peer(have[k], p))
    remove = tuple(k for k in have if k not in want)
    return PeerPlan(add=add, update=update, remove=remove)
