"""How ``anex-agent admin`` prints what the coordinator answered: tables for people, JSON for machines.

Contract:
* :func:`table` renders rows (dicts as the coordinator sent them) under the given columns,
  one line each, columns padded to their widest cell; an empty list prints only the header.
* :func:`details` renders one object as ``FIELD  VALUE`` lines, every top-level field in
  the coordinator's order.
* :func:`cell` turns one JSON value into one line of text: times (ISO 8601 strings, or
  seconds since the epoch for fields named ``*_at``) as ``YYYY-MM-DD HH:MM:SSZ`` in UTC,
  ``null`` as ``-``, a dict as ``k=v,k=v``, a list of scalars comma-joined, anything
  else as compact JSON. Control characters never reach the terminal (shown escaped).
* :func:`dump_json` is the answer as JSON, indented, keys in the coordinator's order.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

NONE = "-"

# (header, the row's field: a dotted name such as ``facts.hostname``, or a function of the row)
Column = tuple[str, str | Callable[[Mapping[str, Any]], Any]]


def _get(row: Mapping[str, Any], name: str) -> Any:
    value: Any = row
    for part in name.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def _printable(text: str) -> str:
    """``text`` with control characters escaped, so a value cannot move the cursor or recolour the terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _time(value: Any, *, epoch: bool) -> str | None:
    if epoch and isinstance(value, (int, float)) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
    if isinstance(value, str) and len(value) >= 19 and value[4:5] == "-" and value[10:11] == "T":
        try:
            when = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        if when.tzinfo is not None:
            when = when.astimezone(timezone.utc)
        return when.strftime("%Y-%m-%d %H:%M:%SZ")
    return None


def cell(value: Any, name: str = "") -> str:
    """One JSON value as one line of text (see the module contract)."""
    if value is None:
        return NONE
    shown = _time(value, epoch=name.endswith("_at"))
    if shown is not None:
        return shown
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return _printable(value) if value else NONE
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Mapping):
        return ",".join(f"{_printable(str(k))}={cell(v)}" for k, v in value.items()) or NONE
    if isinstance(value, list) and all(not isinstance(v, (Mapping, list)) for v in value):
        return ",".join(cell(v) for v in value) or NONE
    return _printable(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


def table(rows: Iterable[Mapping[str, Any]], columns: Sequence[Column]) -> str:
    """The rows under ``columns`` (see the module contract), without a trailing newline."""
    lines = [[header for header, _ in columns]]
    for row in rows:
        lines.append([cell(_get(row, get), get.rpartition(".")[2]) if isinstance(get, str) else cell(get(row))
                      for _, get in columns])
    widths = [max(len(line[i]) for line in lines) for i in range(len(columns))]
    return "\n".join("  ".join(text.ljust(width) for text, width in zip(line, widths)).rstrip() for line in lines)


def details(obj: Mapping[str, Any]) -> str:
    """One object as ``FIELD  VALUE`` lines."""
    width = max((len(name) for name in obj), default=0)
    return "\n".join(f"{name.ljust(width)}  {cell(value, name)}" for name, value in obj.items())


def dump_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)
