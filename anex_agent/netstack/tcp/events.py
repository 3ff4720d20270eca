"""What TCP connections hand their owner: one :class:`Events` object per stack, which the stack
creates, gives every connection it makes, and drains. A connection never calls its owner.

The contract, field by field (a connection only ever adds; the owner takes):

* ``packets``: IP packets to send, in the order they were made. The owner may put its own
  packets (resets for unknown connections, ICMP, UDP) in the same list; it empties the list
  in place (connections hold it).
* ``pending``: connections whose ``output(now)`` should run at the next flush: data was
  written, the peer's window opened, an ACK became due, the pacer released the next segment.
* ``dirty``: connections the user's side should look at again: readable, writable,
  connected, at end of stream, closed.
* ``established``: connections whose handshake completed, in order.
* ``closed``: connections that reached CLOSED, in order. A connection that is established
  and closed within one call appears in both; the owner handles ``established`` first.

When the owner looks: after every call into a connection that can complete a handshake or
close it (a segment, a timer, the user's ``close``/``abort``), and before it looks a
connection up by its addresses, it handles ``established`` and ``closed``
(:meth:`Events.changed` says whether there is anything). ``pending`` and ``dirty`` wait for
the flush, which batches all of a burst's inputs.

Why an output object and not return values: a connection's packets come from deep inside its
work (a retransmission triggered by an ACK, a window update by a read), and the adapter
batches every input of a loop iteration into one flush. Appending to one shared list and
setting a key in a shared dict costs what the connection's former writes into its stack
cost (an attribute load and a store per packet); returning lists would allocate per call
only for the stack to merge them again.
"""

from __future__ import annotations

from typing import Any


class Events:
    """See the module docstring. Connections are keys (``dict`` as an ordered set)."""

    __slots__ = ("packets", "pending", "dirty", "established", "closed")

    def __init__(self) -> None:
        self.packets: list[bytes] = []
        self.pending: dict[Any, None] = {}
        self.dirty: dict[Any, None] = {}
        self.established: list[Any] = []
        self.closed: list[Any] = []

    def changed(self) -> bool:
        """A handshake completed or a connection closed since the owner last took them."""
        return bool(self.established or self.closed)
