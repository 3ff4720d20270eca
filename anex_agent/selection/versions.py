"""Version strings that compare as versions, not as decimals ("12.10" > "12.9").

A version is one to three dot-separated non-negative integers (``major[.minor[.patch]]``,
each 0..999). Missing parts are zero, so ``12.1 == 12.1.0``. For fast column-wise
comparison a version is encoded as one integer key, ``major*10**6 + minor*10**3 + patch``,
which orders exactly like the tuple.
"""

from __future__ import annotations

_PART_LIMIT = 1000


def parse_version(text: str) -> tuple[int, int, int]:
    """Parse ``"12.10"`` into ``(12, 10, 0)``; raise ``ValueError`` saying what is accepted."""
    parts = str(text).strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"{text!r} is not a version: expected MAJOR[.MINOR[.PATCH]] of digits, e.g. 12.4")
    numbers = [int(p) for p in parts]
    if any(n >= _PART_LIMIT for n in numbers):
        raise ValueError(f"{text!r}: each version part must be below {_PART_LIMIT}")
    while len(numbers) < 3:
        numbers.append(0)
    return numbers[0], numbers[1], numbers[2]


def version_key(text: str) -> int:
    """The integer key of a version string; keys order like versions."""
    major, minor, patch = parse_version(text)
    return (major * _PART_LIMIT + minor) * _PART_LIMIT + patch


def key_to_text(key: int) -> str:
    """Inverse of :func:`version_key` for display (trailing ``.0`` patch dropped)."""
    major, rest = divmod(int(key), _PART_LIMIT * _PART_LIMIT)
    minor, patch = divmod(rest, _PART_LIMIT)
    return f"{major}.{minor}" if patch == 0 else f"{major}.{minor}.{patch}"


def float_version_key(value: float | int | str | None) -> float:
    """Key of a provider-reported version that may come as a float (Vast.AI ``cuda_max_good`` 12.4).

    Floats cannot carry ``12.10``; providers that report floats never mean it. Returns NaN
    (never matches a filter) for missing or unparsable values.
    """
    if value is None or value == "":
        return float("nan")
    text = repr(float(value)) if isinstance(value, float) else str(value)
    try:
        return float(version_key(text))
    except ValueError:
        return float("nan")
