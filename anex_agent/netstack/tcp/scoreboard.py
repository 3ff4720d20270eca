"""The sender's SACK scoreboard (RFC 2018 §5, RFC 6675 §3): what the receiver holds above SND.UNA.

Blocks are merged ``[start, end)`` runs of absolute sequence numbers, sorted; the caller
unwraps the peer's 32-bit edges first. Plain lists: a handful of blocks at a time.
"""

from __future__ import annotations


class Scoreboard:
    __slots__ = ("blocks",)

    def __init__(self) -> None:
        self.blocks: list[list[int]] = []

    def __bool__(self) -> bool:
        return bool(self.blocks)

    def __len__(self) -> int:
        return len(self.blocks)

    @property
    def total(self) -> int:
        """SACKed bytes (out of the network, RFC 6675's pipe)."""
        return sum(end - start for start, end in self.blocks)

    @property
    def highest(self) -> int | None:
        return self.blocks[-1][1] if self.blocks else None

    def add(self, start: int, end: int, una: int, top: int) -> None:
        """Merge ``[start, end)``; ignored unless it lies in ``(una, top]`` (bogus or D-SACK)."""
        if not una < end <= top or start >= end:
            return
        start = max(start, una)
        blocks = self.blocks
        i = 0
        while i < len(blocks) and blocks[i][1] < start:
            i += 1
        while i < len(blocks) and blocks[i][0] <= end:  # overlapping or touching: merge
            start = min(start, blocks[i][0])
            end = max(end, blocks[i][1])
            del blocks[i]
        blocks.insert(i, [start, end])

    def acked(self, una: int) -> None:
        """Forget what the cumulative ACK ``una`` covers."""
        blocks = self.blocks
        while blocks and blocks[0][1] <= una:
            blocks.pop(0)
        if blocks and blocks[0][0] < una:
            blocks[0][0] = una

    def clear(self) -> None:
        self.blocks.clear()

    def next_hole(self, seq: int) -> tuple[int, int] | None:
        """The first un-SACKed range at or after ``seq`` that lies below a SACKed block, or None."""
        for start, end in self.blocks:
            if seq < start:
                return seq, start
            if seq < end:
                seq = end
        return None

    def covers(self, start: int, end: int) -> bool:
        """``[start, end)`` lies inside one SACKed block."""
        for s, e in self.blocks:
            if s <= start:
                if end <= e:
                    return True
            else:
                return False
        return False

    def skip(self, seq: int) -> int:
        """``seq``, or the end of the SACKed block holding it."""
        for start, end in self.blocks:
            if start <= seq < end:
                return end
        return seq

    def limit(self, seq: int, n: int) -> int:
        """``n``, shortened so that ``[seq, seq + n)`` stops at the next SACKed block."""
        for start, _ in self.blocks:
            if start > seq:
                return min(n, start - seq)
        return n
