"""wire.reader.read: clients ignore what a newer coordinator added, at any depth; requests stay strict."""

from __future__ import annotations

import json

import pydantic
import pytest

from anex_agent.wire.gateways import GatewayRegisterResponse
from anex_agent.wire.heartbeat import Heartbeat
from anex_agent.wire.nodes import NodeConfig
from anex_agent.wire.reader import read
from anex_agent.wire.watch import WatchEvent


def test_readers_ignore_fields_a_newer_coordinator_added_at_any_depth_and_requests_stay_strict():
    """A coordinator newer than its agents may add fields to what it sends; a request with an
    unknown field is still a 422 on the coordinator (a typo is an error)."""
    gateway = {"id": "g1", "public_key": "A" * 43 + "=", "endpoint": "192.0.2.1:51820",
               "allowed_ips": ["10.254.0.0/16"], "mesh_address": "10.254.0.1", "added_later": {"x": 1}}
    config = {"node_id": "n1", "version": 3, "address": "10.254.0.7", "network": "10.254.0.0/16", "mtu": 1420,
              "dns": ["10.254.0.1"], "gateways": [gateway], "another_new_field": True}
    raw = json.dumps(config)
    parsed = read(NodeConfig, raw)
    assert parsed.gateways[0].endpoint == "192.0.2.1:51820" and parsed.version == 3
    with pytest.raises(pydantic.ValidationError, match="another_new_field"):
        NodeConfig.model_validate_json(raw)  # validated as a request would be: refused
    event = json.dumps({"type": "config", "version": 3, "config": config, "new": 1})
    assert read(WatchEvent, event).config.node_id == "n1"
    with pytest.raises(pydantic.ValidationError):
        Heartbeat.model_validate_json('{"config_version": 1, "surprise": 2}', strict=True)
    peer = {"node_id": "n1", "name": "n1", "public_key": "A" * 43 + "=", "allowed_ips": ["10.254.0.7/32"]}
    registered = {"gateway_id": "g1", "credential": "c" * 40, "address": "10.254.0.1", "network": "10.254.0.0/16",
                  "mtu": 1420, "peers": {"version": 2, "peers": [peer, {**peer, "node_id": "n2", "later": [1]}],
                                         "new": 0}}
    answer = read(GatewayRegisterResponse, json.dumps(registered))
    assert [p.node_id for p in answer.peers.peers] == ["n1", "n2"] and answer.peers.version == 2
    event = json.dumps({"type": "peer_added", "version": 4, "peer": {**peer, "region": "eu"}})
    assert read(WatchEvent, event).peer.node_id == "n1"
