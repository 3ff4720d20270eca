"""wire.telemetry: the one-pass check of a telemetry block agrees with the exact checks it stands in for."""

from __future__ import annotations

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from anex_agent.telemetry import bounds as telemetry_bounds
from anex_agent.wire.telemetry import _telemetry_fine, check_telemetry


_LONG = telemetry_bounds.MAX_STRING
_KEYS = st.sampled_from(["", "a", "gpus", "xid_counts", "gpu_xid_counts", "util_pct", "mem_used_bytes", "temp_c",
                         "power_w", "k\x00", "k" * (_LONG + 1)])
_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([-0.5, 0.0, 2.5, float("nan"), float("inf"),
                                                                   float("-inf"), -1e308]),
    st.sampled_from(["", "ok", "a\x00b", "x" * _LONG, "x" * (_LONG + 1)]),
)


def _sized_list(children):
    """Lists around the bounds (MAX_GPUS for "gpus", MAX_LIST otherwise) without generating each item."""
    return st.builds(lambda item, n: [item] * n, children,
                     st.sampled_from([0, 1, 2, telemetry_bounds.MAX_GPUS, telemetry_bounds.MAX_GPUS + 1,
                                      telemetry_bounds.MAX_LIST, telemetry_bounds.MAX_LIST + 1]))


_JSON = st.recursive(_LEAVES, lambda children: st.one_of(
    _sized_list(children), st.lists(children, max_size=4), st.dictionaries(_KEYS, children, max_size=5)),
    max_leaves=40)


def _exact_checks_pass(block: dict) -> bool:
    try:
        telemetry_bounds.check(check_telemetry(block))
    except ValueError:
        return False
    return True


def _deep(depth: int, leaf) -> dict:
    value = leaf
    for _ in range(depth):
        value = {"d": value}
    return value


@hsettings(max_examples=300, deadline=None)
@given(st.dictionaries(_KEYS, _JSON, max_size=6))
def test_the_telemetry_fast_pass_agrees_with_the_exact_checks(block):
    """On JSON values the one-pass check passes exactly the blocks the exact checks pass
    (were it to pass more, a bad block would be stored; fewer, every heartbeat would pay
    for the slow walk)."""
    assert _telemetry_fine(block, "", 0) is _exact_checks_pass(block)


@pytest.mark.parametrize("block", [
    _deep(telemetry_bounds.MAX_DEPTH, {}), _deep(telemetry_bounds.MAX_DEPTH + 1, {}),
    _deep(telemetry_bounds.MAX_DEPTH, "s"), _deep(telemetry_bounds.MAX_DEPTH + 1, "s"),
    _deep(telemetry_bounds.MAX_DEPTH, 1), _deep(telemetry_bounds.MAX_DEPTH - 1, ["s"]),
    {"gpus": [{"xid_counts": {"79": -1}}]}, {"gpus": [{"xid_counts": {"79": 2}}]}, {"xid_counts": [-1]},
    {"host": {f"k{i}": 1 for i in range(telemetry_bounds.MAX_KEYS + 1)}}, {"a": ("t",)},
])
def test_the_telemetry_fast_pass_at_the_depth_and_shape_edges(block):
    fine = _telemetry_fine(block, "", 0)
    assert fine is False or _exact_checks_pass(block)  # never passes what the exact checks refuse
    if all(type(v) is not tuple for v in block.values()):
        assert fine is _exact_checks_pass(block)
