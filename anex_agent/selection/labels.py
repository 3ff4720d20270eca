"""Node labels that steer machine selection, and the rules for any label (pure).

An on-prem node's labels come from its join token and may be set or removed afterwards by
an administrator (``PATCH /v1/nodes/{node_id}/labels``). Labels selection reads:

| label | value | meaning |
|---|---|---|
| ``price-per-hour`` | number >= 0, USD/hour | the node's price; without it the node is not offered |
| ``busy`` | ``true`` / ``false`` | ``true``: the cluster placed a pod there; not offered |
| ``maintenance`` | ``true`` / ``false`` | ``true``: never offered, whatever else holds |
| ``country`` | ISO 3166-1 alpha-2 code placed in a region | for ``anex.sh/region`` |
| ``upload-mbps`` / ``download-mbps`` | number >= 0, Mbps | for the network speed filters |
| ``qualification`` | a policy (see :mod:`.qualification`) | which hardware rules the node must pass |

Any other label is free-form. Every key is 1-63 characters of letters, digits, ``.``,
``_``, ``-`` and ``/``, beginning and ending with a letter or digit; every value at most
:data:`MAX_VALUE_LENGTH` characters without control characters; at most :data:`MAX_LABELS`
labels per node. :func:`normalize` checks one label and returns its stored value.
"""

from __future__ import annotations

import math
import re

from anex_agent.selection import qualification
from anex_agent.selection.regions import region_of

PRICE = "price-per-hour"
BUSY = "busy"
MAINTENANCE = "maintenance"
COUNTRY = "country"
UPLOAD = "upload-mbps"
DOWNLOAD = "download-mbps"
QUALIFICATION = qualification.LABEL
KNOWN = (PRICE, BUSY, MAINTENANCE, COUNTRY, UPLOAD, DOWNLOAD, QUALIFICATION)

MAX_KEY_LENGTH = 63
MAX_VALUE_LENGTH = 256
MAX_LABELS = 64
_KEY = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?")


def is_true(value: object) -> bool:
    """A boolean label's value: ``true`` in any case is true; anything else is false."""
    return str(value).strip().lower() == "true"


def check_key(key: str) -> None:
    """Raise ``ValueError`` (saying what is accepted) when ``key`` is not a valid label key."""
    if not _KEY.fullmatch(key):
        raise ValueError(f"{key[:80]!r} is not a label key; accepted: 1-{MAX_KEY_LENGTH} letters, digits, '.', '_', "
                         "'-' or '/', beginning and ending with a letter or digit")


def _number(value: str, unit: str) -> str:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{value!r} is not a number; accepted: a non-negative number in {unit}, e.g. \"0.40\"")
    return value


def _boolean(value: str) -> str:
    lowered = value.lower()
    if lowered not in ("true", "false"):
        raise ValueError(f"{value!r} is not a boolean; accepted: \"true\" or \"false\"")
    return lowered


def _country(value: str) -> str:
    code = value.upper()
    if len(code) != 2 or region_of(code) is None:
        raise ValueError(f"{value!r} is not a country code placed in a region; accepted: an ISO 3166-1 alpha-2 "
                         "code such as \"CZ\"")
    return code


def _policy(value: str) -> str:
    qualification.parse_policy(value)
    return ",".join(item.strip().lower() for item in value.split(",") if item.strip())


_VALUES = {PRICE: lambda v: _number(v, "USD/hour"), BUSY: _boolean, MAINTENANCE: _boolean, COUNTRY: _country,
           UPLOAD: lambda v: _number(v, "Mbps"), DOWNLOAD: lambda v: _number(v, "Mbps"), QUALIFICATION: _policy}


def normalize(key: str, value: str) -> str:
    """The value to store for label ``key`` (known labels are checked and normalized).

    Raises ``ValueError`` saying what is accepted.
    """
    check_key(key)
    if len(value) > MAX_VALUE_LENGTH:
        raise ValueError(f"the value is {len(value)} characters long; accepted: at most {MAX_VALUE_LENGTH}")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError("the value contains a control character; accepted: printable text")
    value = value.strip()
    check = _VALUES.get(key)
    return check(value) if check is not None else value
