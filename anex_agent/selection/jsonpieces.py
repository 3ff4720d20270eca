"""Decode a large JSON document in small pieces (pure), so a worker thread never holds the GIL long.

``json.loads`` of a provider answer with 100,000 offers (about 50 MB) is one C call that holds
the GIL for hundreds of milliseconds: run in a worker thread it still stops the event loop for
that long. :func:`loads_in_pieces` gives the same value as ``json.loads`` but decodes the bytes
in chunks of ``chunk`` bytes (incremental UTF-8) and, down to ``depth`` levels of objects and
arrays, each member on its own (``json.JSONDecoder.raw_decode``), so no single C call works
on more than one chunk or one member (one offer). Between calls the interpreter may hand the
GIL to the event loop (``sys.getswitchinterval()``, 5 ms by default).

Freeing such a document is one long C call too (the last reference to a list of 100,000
dicts frees them all at once: ~70 ms at 100,000 offers); :func:`dismantle` frees it in pieces.

Errors: ``ValueError`` (``json.JSONDecodeError`` for malformed JSON), like ``json.loads``.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Sequence
from typing import Any

CHUNK = 1 << 20  # bytes decoded from UTF-8 at a time
DEPTH = 2  # {"offers": [ {...}, ... ]}: each offer is one piece
_WHITESPACE = " \t\n\r"
_AFTER_VALUE = _WHITESPACE + ",:]}"
_DECODER = json.JSONDecoder()


class _Buffer:
    """The text decoded so far that has not been consumed: ``text[pos:]``; ``more()`` appends a chunk."""

    def __init__(self, data: bytes | Sequence[bytes], chunk: int) -> None:
        if isinstance(data, (bytes, bytearray, memoryview)):
            step = max(1, chunk)
            view = memoryview(data)
            data = [view[i:i + step] for i in range(0, len(view), step)]
        self._pieces = iter(data)
        self._next = next(self._pieces, None)
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self.text = ""
        self.pos = 0
        self.final = False
        self.more()

    def more(self) -> bool:
        if self.final:
            return False
        piece, self._next = self._next, next(self._pieces, None)
        self.final = self._next is None
        self.text = self.text[self.pos:] + self._utf8.decode(piece or b"", self.final)
        self.pos = 0
        return True

    def peek(self) -> str:
        """The next character that is not whitespace ('' at the end); does not consume it."""
        while True:
            text, pos = self.text, self.pos
            while pos < len(text) and text[pos] in _WHITESPACE:
                pos += 1
            self.pos = pos
            if pos < len(text) or not self.more():
                return text[pos] if pos < len(text) else ""

    def take(self, expected: str) -> str:
        found = self.peek()
        if found not in expected or not found:
            raise json.JSONDecodeError(f"expected one of {expected!r}", self.text, self.pos)
        self.pos += 1
        return found

    def value(self) -> Any:
        """One complete JSON value (a chunk boundary inside it pulls more text first)."""
        self.peek()
        while True:
            try:
                value, end = _DECODER.raw_decode(self.text, self.pos)
                # a number cut by the chunk boundary still decodes ("0." -> 0): accept a value
                # only when what follows it ends a value
                if self.final or (end < len(self.text) and self.text[end] in _AFTER_VALUE):
                    self.pos = end
                    return value
            except json.JSONDecodeError:
                if self.final:
                    raise
            self.more()


def _parse(buf: _Buffer, depth: int) -> Any:
    opener = buf.peek()
    if depth <= 0 or opener not in ("{", "["):
        return buf.value()
    buf.pos += 1
    closer = "}" if opener == "{" else "]"
    out: Any = {} if opener == "{" else []
    if buf.peek() == closer:
        buf.pos += 1
        return out
    while True:
        if opener == "{":
            key = buf.value()
            if not isinstance(key, str):
                raise json.JSONDecodeError("object keys are strings", buf.text, buf.pos)
            buf.take(":")
            out[key] = _parse(buf, depth - 1)
        else:
            out.append(_parse(buf, depth - 1))
        if buf.take("," + closer) == closer:
            return out


def loads_in_pieces(data: bytes | Sequence[bytes], *, depth: int = DEPTH, chunk: int = CHUNK) -> Any:
    """``json.loads(data)``, decoded in pieces (see the module docstring). ``data`` may be the
    body in parts as it was received (a list of ``bytes``): they are never joined."""
    buf = _Buffer(data, chunk)
    value = _parse(buf, depth)
    if buf.peek():
        raise json.JSONDecodeError("extra data", buf.text, buf.pos)
    return value


PIECE = 1000  # list items freed at a time by dismantle()


def dismantle(value: Any, piece: int = PIECE) -> None:
    """Empty ``value`` (nested dicts and lists) a piece at a time, so that freeing it never means
    one long C call. Call with what is about to be dropped; it is left empty."""
    stack = [value]
    while stack:
        current = stack.pop()
        if isinstance(current, dict):
            for key in list(current):
                item = current.pop(key)
                if isinstance(item, (dict, list)) and len(item) > piece:
                    stack.append(item)
                del item
        elif isinstance(current, list):
            while current:
                chunk = current[-piece:]
                del current[-piece:]
                stack.extend(item for item in chunk if isinstance(item, (dict, list)) and len(item) > piece)
                del chunk
