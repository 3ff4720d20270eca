"""wire.heartbeat: a heartbeat whose telemetry breaks a rule is refused, naming what is wrong."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from anex_agent.telemetry import bounds as telemetry_bounds
from anex_agent.wire.heartbeat import Heartbeat


def test_a_heartbeat_names_what_is_wrong_in_its_telemetry():
    """The fast pass only decides whether to walk: a refused block is named as before."""
    for telemetry, message in [({"gpus": [{"util_pct": -1}]}, "gpus.0.util_pct: must not be negative"),
                               ({"host": {"x": "a\u0000"}}, "host.x: must not contain the NUL character"),
                               ({"xids": [1] * (telemetry_bounds.MAX_LIST + 1)}, "telemetry.xids has 257 items")]:
        body = json.dumps({"telemetry": telemetry})
        with pytest.raises(ValidationError, match=message.replace(".", r"\.")):
            Heartbeat.model_validate_json(body, strict=True)
