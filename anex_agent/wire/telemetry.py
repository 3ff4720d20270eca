"""The rules a telemetry block keeps on the wire, as received, before it is read as a model.

``Heartbeat.telemetry`` (:mod:`anex_agent.wire.heartbeat`) is checked here as it arrives, so
that the rules also hold for keys this version does not know: :func:`check_telemetry` (what
no value may hold, :func:`anex_agent.wire.base.check_free_value`; counters and measures not
negative), then :func:`anex_agent.telemetry.bounds.check` (sizes, nesting). A one-pass check
decides whether those exact, path-naming checks need to walk the block at all (most blocks
pass it). :func:`parse_telemetry` reads a block as the coordinator does, into
:class:`anex_agent.telemetry.models.Telemetry`; the agent uses it to leave out a block the
coordinator would refuse.

Pure: no I/O; imports the telemetry model and its bounds.
"""

from __future__ import annotations

import json
import math
from typing import Any

from anex_agent.telemetry import bounds as telemetry_bounds
from anex_agent.telemetry.models import Telemetry
from anex_agent.wire.base import FREE_TEXT_MAX, at_path, check_free_value

# counters and measures in telemetry that cannot be negative: keys ending so (see anex_agent.gpu)
_NON_NEGATIVE_SUFFIXES = ("_bytes", "_count", "_errors", "_pct", "_mhz", "_w", "_seconds", "_bits", "_gbps")
# the longest string (and key) a telemetry block may hold: the tighter of the two rules
_TELEMETRY_STRING_MAX = min(FREE_TEXT_MAX, telemetry_bounds.MAX_STRING)


def check_telemetry(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """Telemetry is free-form except: finite numbers, and counters/measures (keys ending in
    ``_bytes``, ``_count``, ``_errors``, ``_pct``, ... and the values of ``xid_counts``) not negative."""
    if value is not None:
        check_free_value(value, "")
        _check_non_negative(value, "")
    return value


def check_raw_telemetry(value: Any) -> Any:
    """The generic rules on the block as received, before it is read as :class:`Telemetry`
    (they also hold for keys the model does not know): :func:`check_telemetry`, then
    :func:`anex_agent.telemetry.bounds.check`. A built :class:`Telemetry` is checked as its dict.

    Every heartbeat carries a block (an 8-GPU one is about 600 values), so the common case
    is one pass of :func:`_telemetry_fine`; only a block it does not pass is walked by
    those checks, which name what is wrong."""
    if isinstance(value, Telemetry):
        value = value.as_sent()
    if isinstance(value, dict) and not _telemetry_fine(value, "", 0):
        telemetry_bounds.check(check_telemetry(value))
    return value


def _telemetry_fine(block: dict, key: str, depth: int) -> bool:
    """Whether the object ``block`` (under ``key``, ``depth`` levels down) keeps every rule of
    :func:`check_telemetry` and :func:`anex_agent.telemetry.bounds.check`, in one pass that
    builds no path. True only when both would pass; False where one would raise, and for any
    value that is not of a JSON type (the exact checks then decide)."""
    if depth > telemetry_bounds.MAX_DEPTH or len(block) > telemetry_bounds.MAX_KEYS:
        return False
    counts = key.endswith("xid_counts")  # its values are counts, whatever their keys
    string_ok = depth < telemetry_bounds.MAX_DEPTH  # a string is one level further down
    for name, item in block.items():
        if type(name) is not str or len(name) > _TELEMETRY_STRING_MAX or "\x00" in name:
            return False
        kind = type(item)
        if kind is str:
            if not string_ok or len(item) > _TELEMETRY_STRING_MAX or "\x00" in item:
                return False
        elif kind is int or kind is float:
            if item < 0 and (counts or name.endswith(_NON_NEGATIVE_SUFFIXES)):
                return False
            if kind is float and not math.isfinite(item):
                return False
        elif kind is dict:
            if not _telemetry_fine(item, name, depth + 1):
                return False
        elif kind is list:
            if not _telemetry_items_fine(item, name, depth + 1):
                return False
        elif kind is not bool and item is not None:
            return False
    return True


def _telemetry_items_fine(items: list, key: str, depth: int) -> bool:
    """:func:`_telemetry_fine` for a list (numbers in a list are readings: any finite value)."""
    if depth > telemetry_bounds.MAX_DEPTH or len(items) > (
            telemetry_bounds.MAX_GPUS if key == "gpus" else telemetry_bounds.MAX_LIST):
        return False
    string_ok = depth < telemetry_bounds.MAX_DEPTH
    for item in items:
        kind = type(item)
        if kind is str:
            if not string_ok or len(item) > _TELEMETRY_STRING_MAX or "\x00" in item:
                return False
        elif kind is float:
            if not math.isfinite(item):
                return False
        elif kind is dict:
            if not _telemetry_fine(item, "", depth + 1):
                return False
        elif kind is list:
            if not _telemetry_items_fine(item, "", depth + 1):
                return False
        elif kind is not int and kind is not bool and item is not None:
            return False
    return True


def parse_telemetry(value: dict[str, Any] | Telemetry | None) -> Telemetry | None:
    """A telemetry block as the coordinator reads ``Heartbeat.telemetry`` (through JSON, in
    strict mode), or ``ValueError`` (``TypeError`` for a value JSON cannot hold) saying what is wrong."""
    if value is None:
        return None
    return Telemetry.model_validate_json(json.dumps(check_raw_telemetry(value)), strict=True)


def _check_non_negative(value: Any, path: str) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if isinstance(item, (int, float)) and not isinstance(item, bool) and item < 0 and (
                str(key).endswith(_NON_NEGATIVE_SUFFIXES) or path.endswith("xid_counts")
            ):
                raise ValueError(at_path(where, "must not be negative"))
            _check_non_negative(item, where)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_non_negative(item, f"{path}.{index}" if path else str(index))
