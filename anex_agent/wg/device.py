"""The sans-I/O WireGuard device: peers, index table, cryptokey routing, cookies, timers.

Contract (all three calls return an :class:`Output`; none blocks, reads a clock or
touches a socket)::

    out = device.receive_datagram(data, addr, now)   # a datagram arrived from the Bind
    out = device.send_packet(ip_packet, now)          # the IP layer wants to send a packet
    out = device.update_timers(now)                   # call at (or after) out.next_deadline

and their batch forms, one Output (and one deadline computation) for all of a batch::

    out = device.receive_datagrams([(data, addr), ...], now)
    out = device.send_packets([ip_packet, ...], now)   # a packet that is not IP is dropped, counted

Then the caller sends every ``out.datagrams`` entry ``(bytes, endpoint)`` through its
Bind, hands ``out.packets`` to its IP layer, and calls :meth:`update_timers` no later
than ``out.next_deadline`` (None: no timer pending). ``now`` is monotonic seconds and
must not go backwards. Invalid input from the network never raises: it becomes a
``dropped`` event naming the reason (the RemoteProtocolError text).
"""

from __future__ import annotations

import heapq
import itertools
import os
import random
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import NamedTuple

from anex_agent.errors import LocalProtocolError, RemoteProtocolError
from anex_agent.wg.constants import (
    FIRST_CONTACT_MIN_INTERVAL,
    KEEPALIVE_TIMEOUT,
    MAX_HANDSHAKE_ATTEMPTS,
    MESSAGE_TRANSPORT,
    REJECT_AFTER_TIME,
    REKEY_AFTER_MESSAGES,
    REKEY_AFTER_TIME,
    REKEY_TIMEOUT,
    TRANSPORT_HEADER_SIZE,
    TRANSPORT_MIN_SIZE,
)
from anex_agent.wg.budget import BACKLOG_MAX_AGE, HANDSHAKES_PER_TURN, HandshakeBudget
from anex_agent.wg.cookie import CookieChecker, endpoint_bytes
from anex_agent.wg.crypto import tai64n
from anex_agent.wg.handshake import Identity, consume_initiation
from anex_agent.wg.messages import TRANSPORT_HEADER, CookieReply, Initiation, Response, Transport, parse
from anex_agent.wg.peer import Peer, PeerConfig
from anex_agent.wg.routing import AllowedIPs, packet_addresses
from anex_agent.wg.session import Keypair

Endpoint = Hashable


@dataclass(frozen=True, slots=True)
class Event:
    """Something worth logging or counting. ``kind`` is one of:

    handshake-initiated, handshake-retry, handshake-responded, handshake-complete, handshake-gave-up,
    cookie-sent, cookie-received, keepalive-received, keys-zeroed, dropped.
    """

    kind: str
    peer: bytes | None = None
    detail: str = ""


class ReceivedPacket(NamedTuple):
    """One per decrypted packet (a NamedTuple: a quarter of a frozen dataclass's cost to make)."""

    packet: bytes
    peer: bytes  # sender's public key


_SHED = Event("dropped", None, "under load: handshake rate limit for this source exceeded")


@dataclass(slots=True)
class Output:
    datagrams: list[tuple[bytes, Endpoint]] = field(default_factory=list)
    packets: list[ReceivedPacket] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    next_deadline: float | None = None

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]


class Device:
    """A WireGuard interface without the interface: keys, peers and protocol state.

    ``wall_time`` gives UNIX time for the TAI64N timestamps of initiations (§5.4.2);
    ``random_bytes`` supplies ephemeral keys, indices and cookie secrets; ``jitter``
    returns [0, 1) for the retransmission jitter. ``force_under_load`` set to True/False
    overrides the built-in load estimate (handshake messages per second).

    What handshake work strangers can cause is budgeted (:mod:`anex_agent.wg.budget`): under
    load, initiations wait in a bounded backlog that :meth:`update_timers` works a few at a
    time (``next_deadline`` is then due at once), after the data of the same event-loop turn.
    """

    def __init__(self, private_key: bytes, *, wall_time: Callable[[], float], mtu: int | None = 1420,
                 random_bytes: Callable[[int], bytes] = os.urandom,
                 jitter: Callable[[], float] = random.SystemRandom().random) -> None:
        self.identity = Identity(private_key)
        self.mtu = mtu
        self._wall_time = wall_time
        self._random_bytes = random_bytes
        self._jitter = jitter
        self._cookies = CookieChecker(self.identity.public, random_bytes)
        self._budget = HandshakeBudget()
        self._peers: dict[bytes, Peer] = {}
        self._index: dict[int, tuple[Peer, Keypair | None]] = {}
        self._allowed = AllowedIPs()
        self._out = Output()
        # Timer index (see _refresh_heap): next_deadline() and update_timers() scan no peer list.
        self._heap: list[tuple[float, int, Peer]] = []
        self._scheduled: dict[Peer, float] = {}
        self._seq = itertools.count()
        self._touched: set[Peer] = set()

    @property
    def force_under_load(self) -> bool | None:
        return self._budget.force_under_load

    @force_under_load.setter
    def force_under_load(self, value: bool | None) -> None:
        self._budget.force_under_load = value

    # -- configuration -----------------------------------------------------------

    @property
    def public_key(self) -> bytes:
        return self.identity.public

    def peers(self) -> list[Peer]:
        return list(self._peers.values())

    def peer(self, public_key: bytes) -> Peer | None:
        return self._peers.get(public_key)

    def set_peer(self, config: PeerConfig) -> Peer:
        """Add a peer or update its endpoint/allowed IPs/keepalive (keys and sessions kept when PSK is unchanged)."""
        if config.public_key == self.identity.public:
            raise LocalProtocolError("a peer cannot have the device's own public key")
        peer = self._peers.get(config.public_key)
        if peer is None or peer.config.preshared_key != config.preshared_key:
            if peer is not None:
                self.remove_peer(config.public_key)
            peer = Peer(self.identity, config, self._jitter)
            self._peers[config.public_key] = peer
        else:
            peer.config = config
            if config.endpoint is not None:
                peer.endpoint = config.endpoint
            peer.timers.persistent_keepalive = config.persistent_keepalive or None
        self._allowed.replace_peer(config.public_key, config.allowed_ips)
        self._touched.add(peer)
        self._refresh_heap()
        return peer

    def remove_peer(self, public_key: bytes) -> None:
        peer = self._peers.pop(public_key, None)
        if peer is None:
            return
        self._allowed.remove_peer(public_key)
        self._zero(peer)

    def allowed_ips(self, public_key: bytes) -> list:
        return self._allowed.prefixes_of(public_key)

    # -- the three entry points --------------------------------------------------

    def peer_for(self, address: bytes) -> bytes | None:
        """The public key of the peer whose allowed IPs hold ``address`` (4 or 16 packed bytes), or None."""
        return self._allowed.lookup(address)

    def send_packet(self, packet: bytes, now: float) -> Output:
        """Route ``packet`` by its destination (cryptokey routing) and encrypt it, or stage it and handshake."""
        addrs = packet_addresses(packet)
        if addrs is None:
            raise LocalProtocolError("send_packet() takes an IPv4 or IPv6 packet")
        peer_key = self._allowed.lookup(addrs[1])
        if peer_key is None:
            self._event("dropped", None, "no peer's allowed IPs contain the destination")
            return self._flush()
        peer = self._peers[peer_key]
        peer.staged.append(bytes(packet))
        self._send_staged(peer, now)
        return self._flush()

    def send_packets(self, packets: list[bytes], now: float) -> Output:
        """:meth:`send_packet` for each of ``packets`` in order, one Output for all. Each peer's
        packets are staged, then encrypted in one pass; a packet that is not IPv4/IPv6 is dropped
        (a ``dropped`` event), not raised."""
        lookup = self._allowed.lookup
        peers = self._peers
        touched: dict[Peer, None] = {}
        for packet in packets:
            if packet and packet[0] >> 4 == 4 and len(packet) >= 20:
                dst = packet[16:20]
            else:
                addrs = packet_addresses(packet)
                if addrs is None:
                    self._event("dropped", None, "not an IPv4 or IPv6 packet")
                    continue
                dst = addrs[1]
            peer_key = lookup(dst)
            if peer_key is None:
                self._event("dropped", None, "no peer's allowed IPs contain the destination")
                continue
            peer = peers[peer_key]
            peer.staged.append(packet if type(packet) is bytes else bytes(packet))
            touched[peer] = None
            if len(peer.staged) == peer.staged.maxlen:  # encrypt before the stage overflows
                self._send_staged(peer, now)
        for peer in touched:
            if peer.staged:
                self._send_staged(peer, now)
        return self._flush()

    def receive_datagram(self, data: bytes, addr: Endpoint, now: float) -> Output:
        """Process one datagram from ``addr``."""
        self._receive(data, addr, now)
        return self._flush()

    def receive_datagrams(self, batch: list[tuple[bytes, Endpoint]], now: float) -> Output:
        """Process each ``(datagram, addr)`` of ``batch`` in order, as :meth:`receive_datagram` would;
        one Output for all. Transport messages (the bulk of a batch) take a path without a message object."""
        receive = self._receive
        transport = self._receive_transport
        unpack = TRANSPORT_HEADER.unpack_from
        for data, addr in batch:
            if len(data) >= TRANSPORT_MIN_SIZE and data[0] == MESSAGE_TRANSPORT and type(data) is bytes:
                kind, receiver, counter = unpack(data)
                if kind == MESSAGE_TRANSPORT:  # the reserved bytes are zero
                    try:
                        transport(receiver, counter, data[TRANSPORT_HEADER_SIZE:], len(data), addr, now)
                    except RemoteProtocolError as exc:
                        self._event("dropped", None, str(exc))
                    continue
            receive(data, addr, now)
        return self._flush()

    def _receive(self, data: bytes, addr: Endpoint, now: float) -> None:
        if data and (data[0] == 1 or data[0] == 2) and self._shed(addr, now):
            return
        try:
            msg = parse(data)
            if isinstance(msg, Transport):
                self._receive_transport(msg.receiver, msg.counter, msg.encrypted_packet, len(data), addr, now)
            elif isinstance(msg, CookieReply):
                self._receive_cookie_reply(msg, now)
            else:
                self._receive_handshake(msg, bytes(data), addr, now)
        except RemoteProtocolError as exc:
            self._event("dropped", None, str(exc))

    def update_timers(self, now: float) -> Output:
        """Work the waiting handshake initiations the budget allows, then fire every timer due at ``now``."""
        if self._budget.backlog:
            self._work_backlog(now)
        self._refresh_heap()
        due: list[Peer] = []
        while self._heap and self._heap[0][0] <= now:
            peer = self._settle_top()
            if peer is not None:  # a current entry, due
                heapq.heappop(self._heap)
                del self._scheduled[peer]
                due.append(peer)
        for peer in due:
            self._touched.add(peer)
            for name in peer.timers.pop_expired(now):
                getattr(self, f"_expired_{name}")(peer, now)
        return self._flush()

    def next_deadline(self) -> float | None:
        """The earliest pending timer of any peer, or when waiting initiations can be worked (None: nothing pending)."""
        self._refresh_heap()
        backlog = self._budget.due()
        while self._heap:
            if self._settle_top() is not None:
                top = self._heap[0][0]
                return top if backlog is None else min(top, backlog)
        return backlog

    # The timer index: a heap of (wake-up time, seq, peer) with at most a few entries per peer.
    # ``_scheduled[peer]`` is the peer's earliest entry. A peer touched by a call gets a new entry
    # only when its next deadline moved earlier; an entry that surfaces and no longer matches the
    # peer's deadline is replaced by the current one. No call scans every peer.

    def _refresh_heap(self) -> None:
        for peer in self._touched:
            deadline = peer.timers.next_deadline()
            if deadline is not None and deadline < self._scheduled.get(peer, float("inf")):
                heapq.heappush(self._heap, (deadline, next(self._seq), peer))
                self._scheduled[peer] = deadline
        self._touched.clear()

    def _settle_top(self) -> Peer | None:
        """Return the heap top's peer when the entry is current; otherwise replace or drop it (None)."""
        when, _, peer = self._heap[0]
        actual = peer.timers.next_deadline() if self._peers.get(peer.public_key) is peer else None
        if actual == when and self._scheduled.get(peer) == when:
            return peer
        heapq.heappop(self._heap)
        if self._scheduled.get(peer) == when:
            del self._scheduled[peer]
        if actual is not None and actual < self._scheduled.get(peer, float("inf")):
            heapq.heappush(self._heap, (actual, next(self._seq), peer))
            self._scheduled[peer] = actual
        return None

    def initiate_handshake(self, public_key: bytes, now: float) -> Output:
        """Start a handshake with a peer now (as ``wg`` does when a peer gets persistent keepalive)."""
        self._initiate(self._peers[public_key], now, retry=False)
        return self._flush()

    def initiate_again(self, public_key: bytes, now: float) -> Output:
        """A new initiation to a peer that has no usable session, now, also within REKEY_TIMEOUT of
        the last one. §6.4 spaces initiations REKEY_TIMEOUT apart for a responder that lost one; a
        responder that did not know us a moment ago (a gateway the coordinator tells of us just
        after our first initiation) answers the next one at once, so the caller asks again with a
        back-off of its own. Nothing is sent when the peer has a usable session or its last
        initiation is younger than FIRST_CONTACT_MIN_INTERVAL. Staged packets stay staged and go
        out with the session; the event is ``handshake-initiated`` (the retransmission timer's are
        ``handshake-retry``)."""
        peer = self._peers[public_key]
        kp = peer.keypairs.current
        if (kp is not None and kp.usable_for_sending(now)) or now - peer.last_sent_handshake < FIRST_CONTACT_MIN_INTERVAL:
            return self._flush()
        peer.last_sent_handshake = float("-inf")
        self._initiate(peer, now, retry=False)
        return self._flush()

    def send_keepalive(self, public_key: bytes, now: float) -> Output:
        """Send a keepalive (an empty transport message) to a peer now; a handshake first when
        there is no usable session (§6.5: what the keepalive timers send, on demand)."""
        self._send_keepalive(self._peers[public_key], now)
        return self._flush()

    def expire_sessions(self, public_key: bytes) -> None:
        """Make the current keypairs unusable for sending (testing/forced rekey, like wireguard-go's ExpireCurrentKeypairs)."""
        peer = self._peers[public_key]
        peer.last_sent_handshake = float("-inf")
        for kp in peer.keypairs.all():
            kp.created = float("-inf")

    # -- sending -----------------------------------------------------------------

    def _send_staged(self, peer: Peer, now: float) -> None:
        self._touched.add(peer)
        kp = peer.keypairs.current
        if kp is None or not kp.usable_for_sending(now):
            self._initiate(peer, now, retry=False)
            return
        if peer.endpoint is None:
            self._event("dropped", peer.public_key, f"{len(peer.staged)} packet(s): peer has no endpoint")
            peer.staged.clear()
            return
        staged, encrypt, mtu, endpoint = peer.staged, kp.encrypt, self.mtu, peer.endpoint
        emitted = self._out.datagrams
        sent_bytes = 0
        data = False
        while staged:
            packet = staged.popleft()
            datagram = encrypt(packet, mtu)
            sent_bytes += len(datagram)
            emitted.append((datagram, endpoint))
            if packet:
                data = True
        # the timers' events, once for the whole run: every packet of it went at the same ``now``
        peer.stats.tx_bytes += sent_bytes
        peer.timers.any_authenticated_packet_traversal(now)
        peer.timers.any_authenticated_packet_sent()
        if data:
            peer.timers.data_sent(now)
        # §6.2: the initiator of a session rekeys once it is old or has sent a lot.
        if kp.send_counter > REKEY_AFTER_MESSAGES or (kp.is_initiator and now - kp.created > REKEY_AFTER_TIME):
            self._initiate(peer, now, retry=False)

    def _send_keepalive(self, peer: Peer, now: float) -> None:
        if not peer.staged:
            peer.staged.append(b"")
        self._send_staged(peer, now)

    def _initiate(self, peer: Peer, now: float, *, retry: bool) -> None:
        self._touched.add(peer)
        if not retry:
            peer.timers.handshake_attempts = 0
        if now - peer.last_sent_handshake < REKEY_TIMEOUT:
            return  # §6.4: at most one initiation per REKEY_TIMEOUT
        if peer.endpoint is None:
            self._event("dropped", peer.public_key, "cannot initiate a handshake: peer has no endpoint")
            return
        peer.last_sent_handshake = now
        self._unindex(peer.handshake.local_index)
        index = self._new_index(peer, None)
        msg = peer.handshake.create_initiation(index, self._random_bytes(32), tai64n(self._wall_time()))
        self._emit(peer, peer.cookies.add_macs(msg.to_bytes(), now))
        peer.timers.any_authenticated_packet_traversal(now)
        peer.timers.any_authenticated_packet_sent()
        peer.timers.handshake_initiated(now)
        self._event("handshake-retry" if retry else "handshake-initiated", peer.public_key)

    # -- receiving ---------------------------------------------------------------

    def _receive_handshake(self, msg: Initiation | Response, data: bytes, addr: Endpoint, now: float) -> None:
        """mac1, then (under load) the source's budget and mac2 or a cookie reply (§5.3), then the
        Diffie-Hellman work: at once, or later from the backlog (see :mod:`anex_agent.wg.budget`)."""
        if not self._cookies.check_mac1(data):
            raise RemoteProtocolError("handshake message with an invalid mac1")
        if isinstance(msg, Response):
            entry = self._index.get(msg.receiver)
            if entry is None or entry[1] is not None:
                raise RemoteProtocolError("handshake response for an unknown index")
        budget = self._budget
        if budget.loaded(now):
            src = endpoint_bytes(addr)
            if not self._cookies.check_mac2(data, src, now):
                if not budget.cookies.take(now):
                    raise RemoteProtocolError("under load: cookie reply budget spent")
                reply = self._cookies.create_reply(data, msg.sender, src, now)
                self._out.datagrams.append((reply.to_bytes(), addr))
                self._event("cookie-sent", None, "under load: answered with a cookie reply")
                return
            if isinstance(msg, Initiation):
                self._defer(msg, addr, now)  # behind the data of this turn
                return
        elif isinstance(msg, Initiation) and (budget.backlog or not budget.work.take(now)):
            self._defer(msg, addr, now)
            return
        if isinstance(msg, Initiation):
            self._consume_initiation(msg, addr, now)
        else:
            self._consume_response(msg, addr, now)

    def _shed(self, addr: Endpoint, now: float) -> bool:
        """Count a handshake message; under load, True (and a ``dropped`` event) when its source's
        budget is spent: before parsing or mac1, the cheapest refusal (a valid mac1 proves nothing)."""
        budget = self._budget
        if budget.arrived(now) and not budget.source_allows(addr, now):
            self._out.events.append(_SHED)
            return True
        return False

    def _defer(self, msg: Initiation, addr: Endpoint, now: float) -> None:
        if not self._budget.defer(msg, addr, now):
            raise RemoteProtocolError("handshake backlog full")

    def _work_backlog(self, now: float) -> None:
        """Work up to HANDSHAKES_PER_TURN waiting initiations while the work budget allows."""
        budget = self._budget
        worked = 0
        while budget.backlog and worked < HANDSHAKES_PER_TURN:
            arrived, msg, addr = budget.backlog[0]
            if now - arrived > BACKLOG_MAX_AGE:
                budget.backlog.popleft()
                self._event("dropped", None, "handshake initiation waited too long")
                continue
            if not budget.work.take(now):
                return
            budget.backlog.popleft()
            worked += 1
            try:
                self._consume_initiation(msg, addr, now)
            except RemoteProtocolError as exc:
                self._event("dropped", None, str(exc))

    def _consume_initiation(self, msg: Initiation, addr: Endpoint, now: float) -> None:
        hs = consume_initiation(self.identity, msg, self._find_handshake, now)
        peer = self._peers[hs.remote_static]
        self._touched.add(peer)
        peer.endpoint = addr
        peer.timers.any_authenticated_packet_traversal(now)
        peer.timers.any_authenticated_packet_received()
        self._unindex(hs.local_index)
        index = self._new_index(peer, None)
        response = hs.create_response(index, self._random_bytes(32))
        keypair = hs.derive_keypair(now)
        self._index[index] = (peer, keypair)
        self._drop_keypairs(peer.keypairs.install(keypair))
        self._emit(peer, peer.cookies.add_macs(response.to_bytes(), now))
        peer.timers.any_authenticated_packet_sent()
        peer.timers.session_derived(now)
        self._event("handshake-responded", peer.public_key)

    def _consume_response(self, msg: Response, addr: Endpoint, now: float) -> None:
        entry = self._index.get(msg.receiver)
        if entry is None or entry[1] is not None:
            raise RemoteProtocolError("handshake response for an unknown index")
        peer = entry[0]
        self._touched.add(peer)
        peer.handshake.consume_response(msg)
        peer.endpoint = addr
        peer.timers.any_authenticated_packet_traversal(now)
        peer.timers.any_authenticated_packet_received()
        index = peer.handshake.local_index
        keypair = peer.handshake.derive_keypair(now)
        self._index[index] = (peer, keypair)
        self._drop_keypairs(peer.keypairs.install(keypair))
        peer.timers.session_derived(now)
        self._handshake_complete(peer, now, "initiator")
        self._send_keepalive(peer, now)  # §6.5: confirm the session to the responder

    def _receive_cookie_reply(self, msg: CookieReply, now: float) -> None:
        entry = self._index.get(msg.receiver)
        if entry is None:
            raise RemoteProtocolError("cookie reply for an unknown index")
        entry[0].cookies.consume_reply(msg, now)
        self._event("cookie-received", entry[0].public_key)

    def _receive_transport(self, receiver: int, counter: int, ciphertext: bytes, size: int, addr: Endpoint,
                           now: float) -> None:
        entry = self._index.get(receiver)
        if entry is None or entry[1] is None:
            raise RemoteProtocolError("transport message for an unknown index")
        peer, keypair = entry
        self._touched.add(peer)
        if not keypair.usable_for_receiving(now):
            raise RemoteProtocolError("transport message for an expired session")
        plaintext = keypair.decrypt(counter, ciphertext)
        peer.stats.rx_bytes += size
        if keypair is peer.keypairs.next:
            self._drop_keypairs(peer.keypairs.received_with(keypair))
            self._handshake_complete(peer, now, "responder")
            if peer.staged:
                self._send_staged(peer, now)
        peer.endpoint = addr
        self._keep_key_fresh_receiving(peer, now)
        peer.timers.any_authenticated_packet_traversal(now)
        peer.timers.any_authenticated_packet_received()
        if not plaintext:
            self._event("keepalive-received", peer.public_key)
            return
        peer.timers.data_received(now)
        addrs = packet_addresses(plaintext)
        if addrs is None:
            raise RemoteProtocolError("decrypted payload is not an IPv4/IPv6 packet")
        source, _, total = addrs
        if total > len(plaintext) or total < (20 if len(source) == 4 else 40):
            raise RemoteProtocolError("decrypted packet's length field does not match its size")
        if self._allowed.lookup(source) != peer.public_key:
            raise RemoteProtocolError("decrypted packet's source address is not in the sender's allowed IPs")
        self._out.packets.append(ReceivedPacket(plaintext if total == len(plaintext) else plaintext[:total], peer.public_key))

    def _keep_key_fresh_receiving(self, peer: Peer, now: float) -> None:
        # §6.2: an initiator whose session nears REJECT_AFTER_TIME rekeys once when data arrives.
        kp = peer.keypairs.current
        if peer.timers.sent_last_minute_handshake or kp is None or not kp.is_initiator:
            return
        if now - kp.created > REJECT_AFTER_TIME - KEEPALIVE_TIMEOUT - REKEY_TIMEOUT:
            peer.timers.sent_last_minute_handshake = True
            self._initiate(peer, now, retry=False)

    def _handshake_complete(self, peer: Peer, now: float, role: str) -> None:
        peer.timers.handshake_complete()
        peer.stats.last_handshake = now
        peer.stats.handshakes_completed += 1
        self._event("handshake-complete", peer.public_key, role)

    # -- timer expiry --------------------------------------------------------------

    def _expired_retransmit_handshake(self, peer: Peer, now: float) -> None:
        if peer.timers.handshake_attempts >= MAX_HANDSHAKE_ATTEMPTS:
            peer.timers.gave_up(now)
            peer.staged.clear()
            peer.stats.handshake_attempts_given_up += 1
            self._event("handshake-gave-up", peer.public_key, f"no response after {peer.timers.handshake_attempts + 1} initiations")
            return
        peer.timers.handshake_attempts += 1
        self._initiate(peer, now, retry=True)

    def _expired_send_keepalive(self, peer: Peer, now: float) -> None:
        self._send_keepalive(peer, now)
        if peer.timers.need_another_keepalive:
            peer.timers.need_another_keepalive = False
            peer.timers.deadlines["send_keepalive"] = now + KEEPALIVE_TIMEOUT

    def _expired_new_handshake(self, peer: Peer, now: float) -> None:
        self._initiate(peer, now, retry=False)

    def _expired_zero_key_material(self, peer: Peer, now: float) -> None:
        self._zero(peer)
        self._event("keys-zeroed", peer.public_key)

    def _expired_persistent_keepalive(self, peer: Peer, now: float) -> None:
        if peer.timers.persistent_keepalive:
            self._send_keepalive(peer, now)

    # -- helpers -------------------------------------------------------------------

    def _find_handshake(self, remote_static: bytes):
        peer = self._peers.get(remote_static)
        return peer.handshake if peer is not None else None

    def _new_index(self, peer: Peer, keypair: Keypair | None) -> int:
        while True:
            index = int.from_bytes(self._random_bytes(4), "little")
            if index and index not in self._index:
                self._index[index] = (peer, keypair)
                return index

    def _unindex(self, index: int) -> None:
        entry = self._index.get(index)
        if entry is not None and entry[1] is None:
            del self._index[index]

    def _drop_keypairs(self, keypairs: list[Keypair]) -> None:
        for kp in keypairs:
            if self._index.get(kp.local_index, (None, None))[1] is kp:
                del self._index[kp.local_index]
            kp.zero()

    def _zero(self, peer: Peer) -> None:
        self._touched.add(peer)
        self._drop_keypairs(peer.keypairs.all())
        peer.keypairs.zero_all()
        self._unindex(peer.handshake.local_index)
        peer.handshake.clear()
        peer.staged.clear()

    def _emit(self, peer: Peer, datagram: bytes) -> None:
        peer.stats.tx_bytes += len(datagram)
        self._out.datagrams.append((datagram, peer.endpoint))

    def _event(self, kind: str, peer: bytes | None, detail: str = "") -> None:
        self._out.events.append(Event(kind, peer, detail))

    def _flush(self) -> Output:
        out, self._out = self._out, Output()
        out.next_deadline = self.next_deadline()
        return out
