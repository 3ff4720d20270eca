"""One WireGuard peer: its configuration, handshake, keypairs, timers and staged packets.

A :class:`Peer` holds state only; :class:`anex_agent.wg.device.Device` drives it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from anex_agent.errors import LocalProtocolError
from anex_agent.wg.constants import KEY_SIZE, MAX_STAGED_PACKETS
from anex_agent.wg.cookie import CookieGenerator
from anex_agent.wg.handshake import Handshake, Identity
from anex_agent.wg.session import Keypairs
from anex_agent.wg.timers import PeerTimers


@dataclass(frozen=True)
class PeerConfig:
    """What ``wg set wg0 peer ...`` configures.

    ``endpoint`` is whatever the Bind uses as an address (``(host, port)`` for UDP);
    None for a peer that only ever initiates towards us. ``persistent_keepalive`` in
    seconds, None/0 for off.
    """

    public_key: bytes
    allowed_ips: Sequence[str] = ()
    endpoint: Hashable | None = None
    preshared_key: bytes | None = None
    persistent_keepalive: float | None = None

    def __post_init__(self) -> None:
        if len(self.public_key) != KEY_SIZE:
            raise LocalProtocolError("peer public key must be 32 bytes")
        if self.preshared_key is not None and len(self.preshared_key) != KEY_SIZE:
            raise LocalProtocolError("preshared key must be 32 bytes")
        if self.persistent_keepalive is not None and not 0 <= self.persistent_keepalive <= 65535:
            raise LocalProtocolError("persistent keepalive is 0..65535 seconds")


@dataclass
class PeerStats:
    rx_bytes: int = 0
    tx_bytes: int = 0
    last_handshake: float | None = None  # the device's ``now`` of the last completed handshake
    handshakes_completed: int = 0
    handshake_attempts_given_up: int = 0


class Peer:
    def __init__(self, identity: Identity, config: PeerConfig, jitter: Callable[[], float]) -> None:
        self.public_key = config.public_key
        self.endpoint = config.endpoint
        self.handshake = Handshake(identity, config.public_key, config.preshared_key)
        self.cookies = CookieGenerator(config.public_key)
        self.keypairs = Keypairs()
        self.timers = PeerTimers(jitter, config.persistent_keepalive)
        self.staged: deque[bytes] = deque(maxlen=MAX_STAGED_PACKETS)
        self.last_sent_handshake = float("-inf")
        self.stats = PeerStats()
        self.config = config

    def __repr__(self) -> str:
        return f"Peer({self.public_key.hex()[:16]}..., endpoint={self.endpoint!r})"
