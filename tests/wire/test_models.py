"""wire.Model: what is parsed from JSON is walked for NUL, over-long free text and non-finite numbers."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from anex_agent.wire import models as wire


@pytest.mark.parametrize("raw, field", [
    ('{"labels": {"k": "v\\u0000"}}', "labels"),
    ('{"labels": {"k\\u0000": "v"}}', "labels"),
])
def test_nul_in_json_is_refused(raw, field):
    with pytest.raises(ValidationError) as err:
        wire.JoinTokenCreate.model_validate_json(raw)
    assert [e["loc"][0] for e in err.value.errors()] == [field]


def test_untyped_objects_are_walked_in_json():
    for detect in ('{"a": [1, NaN]}', '{"a": {"b": Infinity}}', '{"a": "%s"}' % ("x" * 5000), '{"a\\u0000": 1}'):
        with pytest.raises(ValidationError) as err:
            wire.NodeFacts.model_validate_json('{"detect": %s}' % detect)
        assert err.value.errors()[0]["loc"] == ("detect",)
    assert wire.NodeFacts.model_validate_json('{"detect": {"a": [1, 2.5, "x"]}}').detect == {"a": [1, 2.5, "x"]}


def test_models_built_in_python_are_not_walked():
    """The coordinator's own answers never fail on a stored value (e.g. an old row)."""
    facts = wire.NodeFacts(detect={"why": "x\x00" + "y" * 5000})
    assert facts.detect["why"].startswith("x\x00")


def test_strict_json_keeps_datetimes_and_enums():
    raw = ('{"id": "t", "kind": "node", "reusable": false, "labels": {}, "created_at": "2026-01-01T00:00:00Z",'
           ' "expires_at": "2026-01-02T00:00:00+00:00"}')
    view = wire.JoinTokenView.model_validate_json(raw, strict=True)
    assert view.kind is wire.TokenKind.node and view.created_at.year == 2026
    with pytest.raises(ValidationError):
        wire.JoinTokenView.model_validate_json(raw.replace("false", "0"), strict=True)
    assert wire.JoinTokenView.model_validate_json(raw.replace("false", "0")).reusable is False  # clients: lax


@pytest.mark.parametrize("target", ["db:٣", "db:３", "db:²", "2001:db8::1:80", "db:0", "db :80"])
def test_tunnel_target_uses_the_one_host_port_rule(target):
    with pytest.raises(ValidationError):
        wire.TunnelSpec(listen_port=5432, target=target)


def test_float_fields_refuse_nan_even_in_python():
    with pytest.raises(ValidationError):
        wire.TransportStatus(last_handshake_age=float("nan"))


def test_readers_ignore_fields_a_newer_coordinator_added_at_any_depth_and_requests_stay_strict():
    """A coordinator newer than its agents may add fields to what it sends; a request with an
    unknown field is still a 422 on the coordinator (a typo is an error)."""
    import json

    import pydantic

    from anex_agent.wire import models as wire

    gateway = {"id": "g1", "public_key": "A" * 43 + "=", "endpoint": "192.0.2.1:51820",
               "allowed_ips": ["10.254.0.0/16"], "mesh_address": "10.254.0.1", "added_later": {"x": 1}}
    config = {"node_id": "n1", "version": 3, "address": "10.254.0.7", "network": "10.254.0.0/16", "mtu": 1420,
              "dns": ["10.254.0.1"], "gateways": [gateway], "another_new_field": True}
    raw = json.dumps(config)
    parsed = wire.read(wire.NodeConfig, raw)
    assert parsed.gateways[0].endpoint == "192.0.2.1:51820" and parsed.version == 3
    with pytest.raises(pydantic.ValidationError, match="another_new_field"):
        wire.NodeConfig.model_validate_json(raw)  # validated as a request would be: refused
    event = json.dumps({"type": "config", "version": 3, "config": config, "new": 1})
    assert wire.read(wire.WatchEvent, event).config.node_id == "n1"
    with pytest.raises(pydantic.ValidationError):
        wire.Heartbeat.model_validate_json('{"config_version": 1, "surprise": 2}', strict=True)
    peer = {"node_id": "n1", "name": "n1", "public_key": "A" * 43 + "=", "allowed_ips": ["10.254.0.7/32"]}
    registered = {"gateway_id": "g1", "credential": "c" * 40, "address": "10.254.0.1", "network": "10.254.0.0/16",
                  "mtu": 1420, "peers": {"version": 2, "peers": [peer, {**peer, "node_id": "n2", "later": [1]}],
                                         "new": 0}}
    answer = wire.read(wire.GatewayRegisterResponse, json.dumps(registered))
    assert [p.node_id for p in answer.peers.peers] == ["n1", "n2"] and answer.peers.version == 2
    event = json.dumps({"type": "peer_added", "version": 4, "peer": {**peer, "region": "eu"}})
    assert wire.read(wire.WatchEvent, event).peer.node_id == "n1"


# ---------------------------------------------------------------- the telemetry fast pass

from hypothesis import given, settings as hsettings, strategies as st  # noqa: E402

from anex_agent.telemetry import bounds as telemetry_bounds  # noqa: E402

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
        telemetry_bounds.check(wire.check_telemetry(block))
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
    assert wire._telemetry_fine(block, "", 0) is _exact_checks_pass(block)


@pytest.mark.parametrize("block", [
    _deep(telemetry_bounds.MAX_DEPTH, {}), _deep(telemetry_bounds.MAX_DEPTH + 1, {}),
    _deep(telemetry_bounds.MAX_DEPTH, "s"), _deep(telemetry_bounds.MAX_DEPTH + 1, "s"),
    _deep(telemetry_bounds.MAX_DEPTH, 1), _deep(telemetry_bounds.MAX_DEPTH - 1, ["s"]),
    {"gpus": [{"xid_counts": {"79": -1}}]}, {"gpus": [{"xid_counts": {"79": 2}}]}, {"xid_counts": [-1]},
    {"host": {f"k{i}": 1 for i in range(telemetry_bounds.MAX_KEYS + 1)}}, {"a": ("t",)},
])
def test_the_telemetry_fast_pass_at_the_depth_and_shape_edges(block):
    fine = wire._telemetry_fine(block, "", 0)
    assert fine is False or _exact_checks_pass(block)  # never passes what the exact checks refuse
    if all(type(v) is not tuple for v in block.values()):
        assert fine is _exact_checks_pass(block)


def test_a_heartbeat_names_what_is_wrong_in_its_telemetry():
    """The fast pass only decides whether to walk: a refused block is named as before."""
    for telemetry, message in [({"gpus": [{"util_pct": -1}]}, "gpus.0.util_pct: must not be negative"),
                               ({"host": {"x": "a\u0000"}}, "host.x: must not contain the NUL character"),
                               ({"xids": [1] * (telemetry_bounds.MAX_LIST + 1)}, "telemetry.xids has 257 items")]:
        body = json.dumps({"telemetry": telemetry})
        with pytest.raises(ValidationError, match=message.replace(".", r"\.")):
            wire.Heartbeat.model_validate_json(body, strict=True)
