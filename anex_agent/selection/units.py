"""Units of the numeric annotations and conversions from provider units.

Annotation units (Anex docs, "Numeric Filters" table): counts, MB, GB/s, TFLOPS, version,
cores, USD/hour, Mbps, GB, MB/s. Providers report other units; every conversion into the
annotation unit lives here so the offer model holds annotation units only.
"""

from __future__ import annotations

import math

MB_PER_GB = 1024  # Vast.AI/RunPod GPU memory: 24 GB card = 24576 MB (the docs' "20480 # ≥ 20GB")
NAN = float("nan")


def compute_cap_key(text: str) -> int:
    """``"8.6"`` -> 860: CUDA compute capability x 100 (the Vast.AI ``compute_cap`` encoding)."""
    major, dot, minor = str(text).strip().partition(".")
    if not major.isdigit() or (dot and not minor.isdigit()) or len(minor) > 1:
        raise ValueError(f"{text!r} is not a compute capability: expected MAJOR.MINOR, e.g. 8.6")
    return int(major) * 100 + (int(minor) * 10 if minor else 0)


def compute_cap_text(key: float) -> str:
    """860 -> ``"8.6"``."""
    if key != key:  # NaN
        return "unknown"
    major, rest = divmod(int(key), 100)
    return f"{major}.{rest // 10}"


def num(value: object, scale: float = 1.0) -> float:
    """A provider number in annotation units, NaN when missing or not a finite number."""
    if value is None or isinstance(value, bool):
        return NAN
    try:
        out = float(value) * scale
    except (TypeError, ValueError):
        return NAN
    return out if math.isfinite(out) else NAN


def gb_to_mb(value: object) -> float:
    return num(value, MB_PER_GB)
