"""Protocol constants of WireGuard, each citing the whitepaper section it comes from.

The whitepaper is "WireGuard: Next Generation Kernel Network Tunnel" (J. A. Donenfeld,
revision e2da747); section numbers below refer to it.
"""

from __future__ import annotations

# §5.4 Construction and identifier mixed into the initial chaining key and hash.
CONSTRUCTION = b"Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s"
IDENTIFIER = b"WireGuard v1 zx2c4 Jason@zx2c4.com"
# §5.4.4 / §5.4.7 labels for the mac1 key and the cookie-encryption key.
LABEL_MAC1 = b"mac1----"
LABEL_COOKIE = b"cookie--"

# §5.4 message types (first byte; the next three bytes are reserved zero).
MESSAGE_INITIATION = 1
MESSAGE_RESPONSE = 2
MESSAGE_COOKIE_REPLY = 3
MESSAGE_TRANSPORT = 4

# §5.4.2, §5.4.3, §5.4.7, §5.4.6 exact message sizes (transport: minimum, header + tag).
INITIATION_SIZE = 148
RESPONSE_SIZE = 92
COOKIE_REPLY_SIZE = 64
TRANSPORT_HEADER_SIZE = 16
AEAD_TAG_SIZE = 16
TRANSPORT_MIN_SIZE = TRANSPORT_HEADER_SIZE + AEAD_TAG_SIZE
KEY_SIZE = 32
MAC_SIZE = 16
TIMESTAMP_SIZE = 12
# §5.4.6 plaintext is zero-padded to a multiple of 16 bytes.
PADDING_MULTIPLE = 16

# §6.1 (Table in §6.1 "Preliminaries").
REKEY_AFTER_MESSAGES = 2**60
REJECT_AFTER_MESSAGES = 2**64 - 2**13 - 1
REKEY_AFTER_TIME = 120.0
REJECT_AFTER_TIME = 180.0
REKEY_ATTEMPT_TIME = 90.0
REKEY_TIMEOUT = 5.0
KEEPALIVE_TIMEOUT = 10.0
# §6.1: jitter of up to a third of a second added to REKEY_TIMEOUT (wireguard-go: 333 ms).
REKEY_TIMEOUT_JITTER_MAX = 0.333
# §6.4: after REKEY_ATTEMPT_TIME of retries, give up (REKEY_ATTEMPT_TIME / REKEY_TIMEOUT attempts).
MAX_HANDSHAKE_ATTEMPTS = int(REKEY_ATTEMPT_TIME / REKEY_TIMEOUT)
# §6.3: key material is erased after 3 * REJECT_AFTER_TIME without a new session.
ZERO_KEY_MATERIAL_AFTER = 3 * REJECT_AFTER_TIME

# §5.4.7: the responder's cookie secret changes every two minutes; a received cookie
# is used for at most two minutes (wireguard-go uses 120 s for both).
COOKIE_SECRET_LIFETIME = 120.0
COOKIE_LIFETIME = 120.0

# §5.1: handshake initiations from one peer are accepted at most this often
# (wireguard-go: HandshakeInitationRate = 1 s / 50) to blunt replays of fresh initiations.
INITIATION_MIN_INTERVAL = 1.0 / 50

# Transport replay window (§5.4.6 refers to RFC 6479). 2048 bits like wireguard-go's
# ring of 32 x 64-bit blocks; counters older than the newest minus (REPLAY_WINDOW - 1)
# are refused.
REPLAY_WINDOW = 2048

# Packets queued per peer while no session exists (wireguard-go: QueueStagedSize = 128).
MAX_STAGED_PACKETS = 128

# Our own load heuristic (§5.3 leaves it to the implementation): more than this many
# handshake messages within one second puts the device "under load" for one second,
# and it then answers initiations without a valid mac2 with a cookie reply.
UNDER_LOAD_HANDSHAKES_PER_SECOND = 64
UNDER_LOAD_HOLD = 1.0

# Our own: Device.initiate_again() sends a new initiation to a peer without a session at most
# this often (§6.4's REKEY_TIMEOUT is for a responder that lost one; a first contact retries sooner).
FIRST_CONTACT_MIN_INTERVAL = 0.1
