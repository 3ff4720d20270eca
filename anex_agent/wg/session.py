"""Transport sessions: a keypair derived by a handshake, its counters and its replay window
(whitepaper §5.4.5 "Transport Data Key Derivation", §5.4.6 "Subsequent Messages: Transport Data").

A :class:`Keypair` encrypts with a counter that starts at 0 and never repeats, and
decrypts with a :class:`ReplayWindow`. It is unusable once older than REJECT_AFTER_TIME
or after REJECT_AFTER_MESSAGES (§6.1); :meth:`Keypair.zero` drops its keys.
:class:`Keypairs` holds the three slots of §6.2 (previous / current / next) so traffic keeps
flowing across a rekey.
"""

from __future__ import annotations

import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from anex_agent.errors import LocalProtocolError, RemoteProtocolError
from anex_agent.wg.constants import MESSAGE_TRANSPORT, PADDING_MULTIPLE, REJECT_AFTER_MESSAGES, REJECT_AFTER_TIME
from anex_agent.wg.messages import TRANSPORT_HEADER as _TRANSPORT_HEADER
from anex_agent.wg.replay import ReplayWindow

#: The 96-bit nonce of a transport message: 32 zero bits, then the 64-bit little-endian counter
#: (:func:`anex_agent.wg.crypto.counter_nonce`, packed in one call).
_NONCE = struct.Struct("<4xQ")


def padded(packet: bytes, mtu: int | None) -> bytes:
    """Zero-pad ``packet`` to a multiple of 16 bytes (§5.4.6), never beyond ``mtu`` (when given)."""
    size = len(packet)
    target = -(-size // PADDING_MULTIPLE) * PADDING_MULTIPLE
    if mtu is not None and target > mtu:
        target = max(mtu, size)
    return packet + bytes(target - size) if target != size else packet


class Keypair:
    """Send/receive keys of one session. ``local_index`` is how peers address us in type-4 messages."""

    __slots__ = (
        "local_index", "remote_index", "is_initiator", "created",
        "_send", "_recv", "send_counter", "replay", "_zeroed",
    )

    def __init__(self, send_key: bytes, recv_key: bytes, *, local_index: int, remote_index: int,
                 is_initiator: bool, created: float) -> None:
        self._send = ChaCha20Poly1305(send_key)
        self._recv = ChaCha20Poly1305(recv_key)
        self.local_index = local_index
        self.remote_index = remote_index
        self.is_initiator = is_initiator
        self.created = created
        self.send_counter = 0
        self.replay = ReplayWindow()
        self._zeroed = False

    def usable_for_sending(self, now: float) -> bool:
        return (not self._zeroed and self.send_counter < REJECT_AFTER_MESSAGES
                and now - self.created < REJECT_AFTER_TIME)

    def usable_for_receiving(self, now: float) -> bool:
        return not self._zeroed and now - self.created < REJECT_AFTER_TIME

    def encrypt(self, packet: bytes, mtu: int | None = None) -> bytes:
        """Return the whole type-4 datagram carrying ``packet`` (b"" is a keepalive); uses the next counter."""
        if self._zeroed:
            raise LocalProtocolError("keypair was zeroed")
        counter = self.send_counter
        if counter >= REJECT_AFTER_MESSAGES:
            raise LocalProtocolError("keypair exhausted its message counter")
        self.send_counter = counter + 1
        size = len(packet)
        if size % PADDING_MULTIPLE:  # padded() inline: this runs once per packet sent
            packet = padded(packet, mtu)
        sealed = self._send.encrypt(_NONCE.pack(counter), packet, None)
        return _TRANSPORT_HEADER.pack(MESSAGE_TRANSPORT, self.remote_index, counter) + sealed

    def decrypt(self, counter: int, ciphertext: bytes) -> bytes:
        """Authenticate and decrypt, then check the replay window. Returns the padded plaintext.

        Raises RemoteProtocolError for a forged/garbled message, a replayed or too-old counter.
        """
        if self._zeroed:
            raise RemoteProtocolError("transport message for a zeroed keypair")
        if not self.replay.would_accept(counter):
            raise RemoteProtocolError(f"transport counter {counter} replayed or outside the window")
        try:
            plaintext = self._recv.decrypt(_NONCE.pack(counter), ciphertext, None)
        except InvalidTag:
            raise RemoteProtocolError("transport message failed authentication") from None
        if not self.replay.check(counter):  # pragma: no cover - would_accept said yes just before
            raise RemoteProtocolError(f"transport counter {counter} replayed")
        return plaintext

    def zero(self) -> None:
        """Forget the keys (§6.3). Python cannot wipe memory; dropping every reference is what we can do."""
        self._send = self._recv = None  # type: ignore[assignment]
        self._zeroed = True


class Keypairs:
    """previous / current / next keypair slots of one peer (§6.2, wireguard-go ``Keypairs``)."""

    __slots__ = ("previous", "current", "next")

    def __init__(self) -> None:
        self.previous: Keypair | None = None
        self.current: Keypair | None = None
        self.next: Keypair | None = None

    def all(self) -> list[Keypair]:
        return [k for k in (self.previous, self.current, self.next) if k is not None]

    def install(self, keypair: Keypair) -> list[Keypair]:
        """Install a freshly derived keypair; return the keypairs that fell out (to unindex and zero).

        Initiator: the new one becomes current at once (the responder confirmed it).
        Responder: it waits in ``next`` until the initiator's first transport message arrives.
        """
        dropped: list[Keypair] = []
        if keypair.is_initiator:
            if self.previous is not None:
                dropped.append(self.previous)
            if self.next is not None:
                # the peer may still send with the unconfirmed ``next``: keep it as previous
                if self.current is not None:
                    dropped.append(self.current)
                self.previous, self.next = self.next, None
            else:
                self.previous = self.current
            self.current = keypair
        else:
            if self.next is not None:
                dropped.append(self.next)
            if self.previous is not None:
                dropped.append(self.previous)
            self.next, self.previous = keypair, None
        return dropped

    def received_with(self, keypair: Keypair) -> list[Keypair]:
        """Called after a transport message authenticated with ``keypair``; confirms ``next``.

        Returns dropped keypairs; the caller checks ``keypair is`` the old ``next`` to know a
        handshake just completed on the responder side.
        """
        if keypair is not self.next:
            return []
        dropped = [self.previous] if self.previous is not None else []
        self.previous = self.current
        self.current = keypair
        self.next = None
        return dropped

    def zero_all(self) -> list[Keypair]:
        dropped = self.all()
        for k in dropped:
            k.zero()
        self.previous = self.current = self.next = None
        return dropped
