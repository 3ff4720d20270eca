"""Out-of-order data held until the gap before it fills (RFC 9293 §3.10.7.4, "segment text").

Segments are kept as non-overlapping ``(start, bytearray)`` runs sorted by their absolute
sequence number; a run that overlaps or touches another is merged into it. A run grows in
place, so extending it costs the new bytes only: behind one hole on a long path thousands of
segments extend the same run, and building a new run each time (copying all it held) made
the receiver quadratic in the window. The caller bounds what it offers by its receive window,
so the queue is bounded too.
"""

from __future__ import annotations

import bisect


class Reassembly:
    __slots__ = ("_starts", "_data", "size", "fin_at")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._data: list[bytearray] = []
        self.size = 0
        self.fin_at: int | None = None  # sequence number of a FIN seen beyond a gap

    def __len__(self) -> int:
        return len(self._starts)

    def add(self, start: int, data) -> None:
        """Keep a copy of ``data`` (any bytes-like object) starting at absolute sequence ``start``
        (merging with neighbours)."""
        end = start + len(data)
        starts, datas = self._starts, self._data
        i = bisect.bisect_left(starts, start)
        if i > 0 and starts[i - 1] + len(datas[i - 1]) >= start:  # touches or overlaps the run before
            run = datas[i - 1]
            pend = starts[i - 1] + len(run)
            if pend >= end:
                return  # nothing new
            with memoryview(data) as view:
                run += view[pend - start:]  # in place: what the run held is not copied
            self.size += end - pend
            i -= 1
        else:
            run = bytearray(data)
            starts.insert(i, start)
            datas.insert(i, run)
            self.size += len(run)
        start = starts[i]
        i += 1
        while i < len(starts) and starts[i] <= end:  # swallow runs that start inside this one
            nstart, ndata = starts[i], datas[i]
            nend = nstart + len(ndata)
            if nend > end:
                with memoryview(ndata) as view:
                    run += view[end - nstart:]
                self.size += nend - end
                end = nend
            self.size -= len(ndata)
            del starts[i], datas[i]

    def pop_ready(self, rcv_nxt: int) -> bytes | bytearray | None:
        """Data continuing at ``rcv_nxt`` now (runs before it trimmed), or None. The run is handed
        over, not copied, when it starts exactly at ``rcv_nxt``."""
        starts, datas = self._starts, self._data
        while starts and starts[0] <= rcv_nxt:
            start, data = starts.pop(0), datas.pop(0)
            self.size -= len(data)
            if start + len(data) > rcv_nxt:
                return data if start == rcv_nxt else bytes(memoryview(data)[rcv_nxt - start:])
        return None

    def blocks(self) -> list[tuple[int, int]]:
        """The held runs as ``(start, end)`` (for tests and SACK-like reports)."""
        return [(s, s + len(d)) for s, d in zip(self._starts, self._data, strict=True)]
