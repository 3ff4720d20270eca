"""The TCP connection states (RFC 9293 §3.3.2), the errors a connection ends with, and the
sequence-number constants the connection's modules share. Names only, no behaviour.

States are small integers (compared on every segment); :data:`STATE_NAMES` spells them as the
RFC does. A connection that ends with an error keeps it in ``Connection.error``: one of
:data:`REFUSED`, :data:`RESET`, :data:`TIMED_OUT` (the asyncio adapter maps them to
``ConnectionRefusedError``, ``ConnectionResetError`` and ``TimeoutError``).
"""

from __future__ import annotations

CLOSED, SYN_SENT, SYN_RECEIVED, ESTABLISHED, FIN_WAIT_1, FIN_WAIT_2, CLOSE_WAIT, CLOSING, LAST_ACK, TIME_WAIT = range(10)
STATE_NAMES = ("CLOSED", "SYN-SENT", "SYN-RECEIVED", "ESTABLISHED", "FIN-WAIT-1", "FIN-WAIT-2", "CLOSE-WAIT",
               "CLOSING", "LAST-ACK", "TIME-WAIT")
SEND_STATES = frozenset((ESTABLISHED, CLOSE_WAIT, FIN_WAIT_1, CLOSING, LAST_ACK))  # our data and FIN may go
RECEIVE_STATES = frozenset((ESTABLISHED, FIN_WAIT_1, FIN_WAIT_2))  # the peer's data is taken

# Sequence numbers are kept unbounded ("absolute") and wrapped to 32 bits on the wire; a received
# number is unwrapped next to a reference as ``ref + ((wire - ref + HALF) & M32) - HALF``.
M32 = 0xFFFFFFFF
HALF = 1 << 31

# Errors a connection ends with (``Connection.error``).
REFUSED = "refused"
RESET = "reset"
TIMED_OUT = "timed out"
