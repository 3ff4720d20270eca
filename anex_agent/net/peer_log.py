"""Putting what a peer sent into a log line, bounded: every role's one way to do it.

A stranger chooses the bytes of a header, a user name, a token or a request line; a log
line that quotes them verbatim lets it write terminal escapes, forged lines (a newline) or
megabytes into the log. :func:`peer_text` makes such a value safe to log: printable ASCII
kept, everything else escaped (``\\n``, ``\\x1b``, ``\\u202e``), at most ``limit`` characters
of the value shown and the rest counted. :class:`LogBudget` bounds how often one kind of
refusal is logged at all; the caller counts every refusal in its metrics instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable

DEFAULT_LIMIT = 96  # characters of a peer's value shown in a log line


def peer_text(value: object, limit: int = DEFAULT_LIMIT) -> str:
    """``value`` (str, bytes or anything else a peer supplied) as one bounded, escaped token for a log line."""
    if value is None:
        return "-"
    if isinstance(value, (bytes, bytearray, memoryview)):
        text = bytes(value[: limit + 1]).decode("latin-1")
        total = len(value)
    else:
        text = value if isinstance(value, str) else str(value)
        total = len(text)
        text = text[: limit + 1]
    shown = "".join(_escape(c) for c in text[:limit])
    if total > limit:
        shown += f"...({total - limit} more)"
    return shown


def _escape(char: str) -> str:
    code = ord(char)
    if 0x20 <= code < 0x7F and char != "\\":
        return char
    if char == "\\":
        return "\\\\"
    if char in "\n\r\t":
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}[char]
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


class LogBudget:
    """At most ``burst`` log lines per ``interval`` seconds for one kind of event.

    :meth:`take` says whether this event may be logged: ``None`` when not (the caller only
    counts it), else how many events were not logged since the last one that was (the
    caller says so in its line, naming the metric that counts them all).
    """

    def __init__(self, burst: int = 10, interval: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst, self.interval, self.clock = burst, interval, clock
        self._window_start = float("-inf")
        self._used = 0
        self._skipped = 0

    def take(self) -> int | None:
        now = self.clock()
        if now - self._window_start >= self.interval:
            self._window_start, self._used = now, 0
        if self._used >= self.burst:
            self._skipped += 1
            return None
        self._used += 1
        skipped, self._skipped = self._skipped, 0
        return skipped
