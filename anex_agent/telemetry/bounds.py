"""Bounds on the telemetry block a heartbeat carries (``wire.Heartbeat.telemetry``).

The coordinator keeps the latest block per node, so its size is bounded here once, for
both sides, at any depth: the typed fields of :class:`anex_agent.telemetry.models.Telemetry` carry
the same bounds as model constraints, and this walk also bounds the keys that model does not
know (a newer agent's). The agent's block (:mod:`anex_agent.gpu.telemetry`) stays far inside:

* at most :data:`MAX_GPUS` entries in a ``gpus`` list (``gpus``, ``inventory.gpus``);
* at most :data:`MAX_LIST` items in any other list and :data:`MAX_KEYS` keys in an object;
* strings (keys included) at most :data:`MAX_STRING` characters; nesting at most
  :data:`MAX_DEPTH` levels.

The size in bytes is bounded by the heartbeat route's body limit (413), not here.
:func:`check` raises ``ValueError`` naming the path of the first value over a bound
(the coordinator answers 422 naming ``telemetry``).
"""

from __future__ import annotations

from typing import Any

MAX_GPUS = 64
MAX_LIST = 256
MAX_KEYS = 256
MAX_STRING = 4096
MAX_DEPTH = 8


def check(telemetry: dict[str, Any] | None) -> dict[str, Any] | None:
    """Return ``telemetry`` unchanged, or raise ``ValueError`` naming what is over a bound."""
    if telemetry is not None and not _within(telemetry, "", 0):
        _walk(telemetry, "telemetry", "", 0)  # again, naming the path (only for a refused block)
    return telemetry


def _within(value: Any, key: str, depth: int) -> bool:
    """The fast pass (no path strings): whether ``value`` is within every bound."""
    if depth > MAX_DEPTH:
        return False
    if isinstance(value, str):
        return len(value) <= MAX_STRING
    if isinstance(value, dict):
        if len(value) > MAX_KEYS:
            return False
        for name, item in value.items():
            if len(name) > MAX_STRING:
                return False
            if isinstance(item, (dict, list, str)) and not _within(item, name, depth + 1):
                return False
        return True
    if isinstance(value, list):
        if len(value) > (MAX_GPUS if key == "gpus" else MAX_LIST):
            return False
        return all(_within(item, "", depth + 1) for item in value if isinstance(item, (dict, list, str)))
    return True


def _walk(value: Any, path: str, key: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ValueError(f"{path} is nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        if len(value) > MAX_STRING:
            raise ValueError(f"{path} is a string of {len(value)} characters; at most {MAX_STRING}")
    elif isinstance(value, dict):
        if len(value) > MAX_KEYS:
            raise ValueError(f"{path} has {len(value)} keys; at most {MAX_KEYS}")
        for name, item in value.items():
            if len(name) > MAX_STRING:
                raise ValueError(f"{path} has a key of {len(name)} characters; at most {MAX_STRING}")
            _walk(item, f"{path}.{name}", name, depth + 1)
    elif isinstance(value, list):
        limit = MAX_GPUS if key == "gpus" else MAX_LIST
        if len(value) > limit:
            raise ValueError(f"{path} has {len(value)} items; at most {limit}")
        for index, item in enumerate(value):
            _walk(item, f"{path}[{index}]", "", depth + 1)
