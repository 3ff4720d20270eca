"""The agent leaves out a telemetry block the coordinator would refuse, and still sends its heartbeat."""

from __future__ import annotations

import json
import logging

import pytest

from anex_agent.agent.heartbeat import telemetry_block
from anex_agent.wire.heartbeat import Heartbeat


class FakeMonitor:
    def __init__(self, block):
        self.block = block

    def telemetry(self):
        return self.block


@pytest.mark.parametrize("block", [
    {"gpus": [{"power_w": float("nan")}]},
    {"taken_at": float("inf")},
    {"host": {"rx_bytes": -1}},
    {"nvml": {"reason": "x\x00"}},
    {"nvml": {"reason": "x" * 5000}},
])
def test_refusable_telemetry_is_left_out_with_a_warning(block, caplog):
    with caplog.at_level(logging.WARNING):
        assert telemetry_block(FakeMonitor(block)) is None
    assert "GPU telemetry failed" in caplog.text
    with pytest.raises(ValueError):
        Heartbeat(telemetry=block)


def test_good_telemetry_passes_unchanged():
    block = {"v": 1, "gpus": [{"power_w": 10.5, "gpu_temp_c": 40, "xid_counts": {"79": 2}}],
             "host": {"rx_bytes": 0, "mem_total_bytes": 540000000000, "load1": 0.5}}
    assert telemetry_block(FakeMonitor(block)).as_sent() == block
    assert Heartbeat(telemetry=block).telemetry.as_sent() == block
    sent = Heartbeat(telemetry=block).model_dump_json()
    assert json.loads(sent)["telemetry"] == block  # as sent, no nulls added
    assert '"gpu_temp_c":40,' in sent and '"mem_total_bytes":540000000000,' in sent  # integers stay integers


@pytest.mark.parametrize("block", [
    {"gpus": "not a list"},
    {"gpus": [{"index": "zero"}]},
    {"gpus": [{}] * 65},
    {"inventory": {"gpus": [{"name": 7}]}},
])
def test_telemetry_not_of_the_model_is_left_out(block, caplog):
    with caplog.at_level(logging.WARNING):
        assert telemetry_block(FakeMonitor(block)) is None
    assert "GPU telemetry failed" in caplog.text
