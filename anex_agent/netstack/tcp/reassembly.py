"""Out-of-order data held until the gap before it fills (RFC 9293 §3.10.7.4, "segment text").

Segments are kept as non-overlapping ``(start, bytes)`` runs sorted by their absolute
sequence number; a run that overlaps or touches another is merged into it. The caller
bounds what it offers by its receive window, so the queue is bounded too.
"""

from __future__ import annotations

import bisect


class Reassembly:
    __slots__ = ("_starts", "_data", "size", "fin_at")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._data: list[bytes] = []
        self.size = 0
        self.fin_at: int | None = None  # sequence number of a FIN seen beyond a gap

    def __len__(self) -> int:
        return len(self._starts)

    def add(self, start: int, data: bytes) -> None:
        """Keep ``data`` starting at absolute sequence ``start`` (merging with neighbours)."""
        end = start + len(data)
        starts, datas = self._starts, self._data
        i = bisect.bisect_left(starts, start)
        if i > 0 and starts[i - 1] + len(datas[i - 1]) >= start:  # touches or overlaps the run before
            i -= 1
            pstart, pdata = starts[i], datas[i]
            if pstart + len(pdata) >= end:
                return  # nothing new
            data = pdata + data[pstart + len(pdata) - start:]
            start = pstart
            end = start + len(data)
            self.size -= len(pdata)
            del starts[i], datas[i]
        while i < len(starts) and starts[i] <= end:  # swallow runs that start inside the new one
            nstart, ndata = starts[i], datas[i]
            nend = nstart + len(ndata)
            if nend > end:
                data = data + ndata[end - nstart:]
                end = nend
            self.size -= len(ndata)
            del starts[i], datas[i]
        starts.insert(i, start)
        datas.insert(i, data)
        self.size += len(data)

    def pop_ready(self, rcv_nxt: int) -> bytes | None:
        """Data continuing at ``rcv_nxt`` now (runs before it trimmed), or None."""
        starts, datas = self._starts, self._data
        while starts and starts[0] <= rcv_nxt:
            start, data = starts.pop(0), datas.pop(0)
            self.size -= len(data)
            if start + len(data) > rcv_nxt:
                return data[rcv_nxt - start:]
        return None

    def blocks(self) -> list[tuple[int, int]]:
        """The held runs as ``(start, end)`` (for tests and SACK-like reports)."""
        return [(s, s + len(d)) for s, d in zip(self._starts, self._data, strict=True)]
