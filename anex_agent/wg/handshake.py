"""The Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s handshake (whitepaper §5.4.2 - §5.4.5).

:class:`Identity` is the local static key pair (and the responder's pre-mixed hash).
:class:`Handshake` is the per-peer state machine::

    initiator: EMPTY --create_initiation--> INITIATION_CREATED --consume_response--> RESPONSE_CONSUMED
    responder: EMPTY --consume_initiation--> INITIATION_CONSUMED --create_response--> RESPONSE_CREATED

after which :meth:`Handshake.derive_keypair` returns the transport :class:`Keypair` and the
state goes back to EMPTY. Message bytes, indices, ephemeral private keys and timestamps
are supplied by the caller (the device), which keeps this module free of randomness and
clocks and lets tests fix every input.

mac1/mac2 are not handled here (see :mod:`anex_agent.wg.cookie`); messages come out with
zero macs. Every failure caused by the peer's bytes raises :class:`RemoteProtocolError`;
calling a step in the wrong state raises :class:`LocalProtocolError`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from anex_agent.errors import LocalProtocolError, RemoteProtocolError
from anex_agent.wg import crypto
from anex_agent.wg.constants import CONSTRUCTION, IDENTIFIER, INITIATION_MIN_INTERVAL, KEY_SIZE
from anex_agent.wg.messages import Initiation, Response
from anex_agent.wg.session import Keypair

INITIAL_CHAINING_KEY = crypto.hash(CONSTRUCTION)
INITIAL_HASH = crypto.hash(INITIAL_CHAINING_KEY + IDENTIFIER)


class State(enum.Enum):
    EMPTY = "empty"
    INITIATION_CREATED = "initiation-created"
    INITIATION_CONSUMED = "initiation-consumed"
    RESPONSE_CREATED = "response-created"
    RESPONSE_CONSUMED = "response-consumed"


class Identity:
    """The local static key pair, with the values every handshake starts from."""

    __slots__ = ("private", "public", "_key", "responder_hash")

    def __init__(self, private: bytes) -> None:
        if len(private) != KEY_SIZE:
            raise LocalProtocolError("a private key is 32 bytes")
        self._key = crypto.private_from_bytes(private)
        self.private = private
        self.public = crypto.public_bytes(self._key)
        # §5.4.2: the responder's hash starts as HASH(HASH(Ci || IDENTIFIER) || S_pub_r).
        self.responder_hash = crypto.hash(INITIAL_HASH + self.public)

    def dh(self, public: bytes) -> bytes:
        return crypto.dh(self._key, public)


class Handshake:
    """Handshake state with one peer (remote static key, optional PSK)."""

    def __init__(self, identity: Identity, remote_static: bytes, preshared_key: bytes | None = None) -> None:
        if len(remote_static) != KEY_SIZE:
            raise LocalProtocolError("a peer public key is 32 bytes")
        if preshared_key is not None and len(preshared_key) != KEY_SIZE:
            raise LocalProtocolError("a preshared key is 32 bytes")
        self.identity = identity
        self.remote_static = remote_static
        self.preshared_key = preshared_key or bytes(KEY_SIZE)
        # Precomputed DH(S_priv_local, S_pub_remote); a low-order peer key never completes.
        try:
            self._static_static: bytes | None = identity.dh(remote_static)
        except RemoteProtocolError:
            self._static_static = None
        self.state = State.EMPTY
        self.hash = b""
        self.chaining_key = b""
        self.local_index = 0
        self.remote_index = 0
        self.remote_ephemeral = b""
        self._ephemeral: object | None = None
        # §5.1 replay protection, kept across handshakes with this peer.
        self.last_timestamp = bytes(12)
        self.last_initiation_consumed = float("-inf")

    # -- initiator -------------------------------------------------------------------

    def create_initiation(self, local_index: int, ephemeral_private: bytes, timestamp: bytes) -> Initiation:
        """Build message 1 (§5.4.2) with zero macs; afterwards state is INITIATION_CREATED."""
        if self._static_static is None:
            raise LocalProtocolError("peer public key is a low-order point; no handshake is possible")
        ck = INITIAL_CHAINING_KEY
        h = crypto.hash(INITIAL_HASH + self.remote_static)
        eph = crypto.private_from_bytes(ephemeral_private)
        eph_pub = crypto.public_bytes(eph)
        ck = crypto.kdf1(ck, eph_pub)
        h = crypto.hash(h + eph_pub)
        ck, key = crypto.kdf2(ck, crypto.dh(eph, self.remote_static))
        enc_static = crypto.aead_encrypt(key, 0, self.identity.public, h)
        h = crypto.hash(h + enc_static)
        ck, key = crypto.kdf2(ck, self._static_static)
        enc_ts = crypto.aead_encrypt(key, 0, timestamp, h)
        h = crypto.hash(h + enc_ts)
        self.chaining_key, self.hash, self._ephemeral = ck, h, eph
        self.local_index = local_index
        self.state = State.INITIATION_CREATED
        return Initiation(local_index, eph_pub, enc_static, enc_ts)

    def consume_response(self, msg: Response) -> None:
        """Process message 2 (§5.4.3) answering our initiation; afterwards state is RESPONSE_CONSUMED."""
        if self.state is not State.INITIATION_CREATED or msg.receiver != self.local_index:
            raise RemoteProtocolError("handshake response without a matching initiation")
        eph = self._ephemeral
        ck = crypto.kdf1(self.chaining_key, msg.ephemeral)
        h = crypto.hash(self.hash + msg.ephemeral)
        ck = crypto.kdf1(ck, crypto.dh(eph, msg.ephemeral))  # type: ignore[arg-type]
        ck = crypto.kdf1(ck, self.identity.dh(msg.ephemeral))
        ck, tau, key = crypto.kdf3(ck, self.preshared_key)
        h = crypto.hash(h + tau)
        crypto.aead_decrypt(key, 0, msg.encrypted_nothing, h)
        h = crypto.hash(h + msg.encrypted_nothing)
        self.chaining_key, self.hash = ck, h
        self.remote_index = msg.sender
        self.remote_ephemeral = msg.ephemeral
        self.state = State.RESPONSE_CONSUMED

    # -- responder -------------------------------------------------------------------

    def create_response(self, local_index: int, ephemeral_private: bytes) -> Response:
        """Build message 2 (§5.4.3) with zero macs; afterwards state is RESPONSE_CREATED."""
        if self.state is not State.INITIATION_CONSUMED:
            raise LocalProtocolError("create_response() needs a consumed initiation")
        eph = crypto.private_from_bytes(ephemeral_private)
        eph_pub = crypto.public_bytes(eph)
        ck = crypto.kdf1(self.chaining_key, eph_pub)
        h = crypto.hash(self.hash + eph_pub)
        ck = crypto.kdf1(ck, crypto.dh(eph, self.remote_ephemeral))
        ck = crypto.kdf1(ck, crypto.dh(eph, self.remote_static))
        ck, tau, key = crypto.kdf3(ck, self.preshared_key)
        h = crypto.hash(h + tau)
        enc_nothing = crypto.aead_encrypt(key, 0, b"", h)
        h = crypto.hash(h + enc_nothing)
        self.chaining_key, self.hash = ck, h
        self.local_index = local_index
        self.state = State.RESPONSE_CREATED
        return Response(local_index, self.remote_index, eph_pub, enc_nothing)

    # -- both ------------------------------------------------------------------------

    def derive_keypair(self, now: float) -> Keypair:
        """§5.4.5: split the chaining key into transport keys; the handshake state is erased."""
        if self.state is State.RESPONSE_CONSUMED:
            initiator = True
        elif self.state is State.RESPONSE_CREATED:
            initiator = False
        else:
            raise LocalProtocolError(f"no completed handshake to derive keys from (state {self.state.value})")
        first, second = crypto.kdf2(self.chaining_key, b"")
        send, recv = (first, second) if initiator else (second, first)
        keypair = Keypair(send, recv, local_index=self.local_index, remote_index=self.remote_index,
                          is_initiator=initiator, created=now)
        self.clear()
        return keypair

    def clear(self) -> None:
        """Forget the in-progress handshake (keeps the timestamp/flood history)."""
        self.state = State.EMPTY
        self.hash = self.chaining_key = self.remote_ephemeral = b""
        self._ephemeral = None
        self.local_index = self.remote_index = 0


def consume_initiation(identity: Identity, msg: Initiation, find_peer: Callable[[bytes], Handshake | None],
                       now: float) -> Handshake:
    """Process message 1 (§5.4.2) as responder.

    ``find_peer`` maps the decrypted initiator static key to that peer's :class:`Handshake`.
    Refuses unknown peers, a timestamp not newer than the last one accepted from that peer
    (replay), and initiations arriving faster than INITIATION_MIN_INTERVAL (flood). On success
    the peer's handshake is in state INITIATION_CONSUMED and is returned.
    """
    ck = crypto.kdf1(INITIAL_CHAINING_KEY, msg.ephemeral)
    h = crypto.hash(identity.responder_hash + msg.ephemeral)
    ck, key = crypto.kdf2(ck, identity.dh(msg.ephemeral))
    remote_static = crypto.aead_decrypt(key, 0, msg.encrypted_static, h)
    h = crypto.hash(h + msg.encrypted_static)
    hs = find_peer(remote_static)
    if hs is None:
        raise RemoteProtocolError("handshake initiation from an unknown public key")
    if hs._static_static is None:
        raise RemoteProtocolError("handshake initiation from a low-order public key")
    ck, key = crypto.kdf2(ck, hs._static_static)
    timestamp = crypto.aead_decrypt(key, 0, msg.encrypted_timestamp, h)
    h = crypto.hash(h + msg.encrypted_timestamp)
    if timestamp <= hs.last_timestamp:
        raise RemoteProtocolError("handshake initiation replayed (timestamp not newer than the last one)")
    if now - hs.last_initiation_consumed < INITIATION_MIN_INTERVAL:
        raise RemoteProtocolError("handshake initiations arrive too fast (flood)")
    hs.last_timestamp = timestamp
    hs.last_initiation_consumed = now
    hs.chaining_key, hs.hash = ck, h
    hs.remote_ephemeral = msg.ephemeral
    hs.remote_index = msg.sender
    hs._ephemeral = None
    hs.state = State.INITIATION_CONSUMED
    return hs
