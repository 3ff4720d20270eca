"""Telemetry bounds: each bound refuses just past it and names the path; the agent's block passes."""

from __future__ import annotations

import pytest

from anex_agent.telemetry import bounds as tb


def nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"d": value}
    return value


@pytest.mark.parametrize(("block", "message"), [
    ({"gpus": [{}] * (tb.MAX_GPUS + 1)}, "telemetry.gpus has 65 items"),
    ({"inventory": {"gpus": [{}] * (tb.MAX_GPUS + 1)}}, "telemetry.inventory.gpus has 65 items"),
    ({"xids": [1] * (tb.MAX_LIST + 1)}, "telemetry.xids has 257 items"),
    ({"host": {f"k{i}": 1 for i in range(tb.MAX_KEYS + 1)}}, "telemetry.host has 257 keys"),
    ({"gpus": [{"name": "x" * (tb.MAX_STRING + 1)}]}, "telemetry.gpus[0].name is a string of 4097"),
    ({"k" * (tb.MAX_STRING + 1): 1}, "has a key of 4097 characters"),
    (nested(tb.MAX_DEPTH + 1), "nested deeper than 8"),
])
def test_each_bound_refuses_just_past_it_naming_the_path(block, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        tb.check(block)


def test_blocks_at_the_bounds_pass():
    block = {"gpus": [{"name": "x" * tb.MAX_STRING}] * tb.MAX_GPUS, "xids": [1] * tb.MAX_LIST,
             "host": {f"k{i}": 1 for i in range(tb.MAX_KEYS)}, "deep": nested(tb.MAX_DEPTH - 1)}
    assert tb.check(block) is block
    assert tb.check(None) is None
