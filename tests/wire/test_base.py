"""wire.base.Model: what is parsed from JSON is walked for NUL, over-long free text and non-finite numbers;
strict JSON on the coordinator, lax on clients; the shared field types."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from anex_agent.wire.heartbeat import TransportStatus
from anex_agent.wire.join import JoinTokenCreate, JoinTokenView, TokenKind
from anex_agent.wire.nodes import NodeFacts, TunnelSpec


@pytest.mark.parametrize("raw, field", [
    ('{"labels": {"k": "v\\u0000"}}', "labels"),
    ('{"labels": {"k\\u0000": "v"}}', "labels"),
])
def test_nul_in_json_is_refused(raw, field):
    with pytest.raises(ValidationError) as err:
        JoinTokenCreate.model_validate_json(raw)
    assert [e["loc"][0] for e in err.value.errors()] == [field]


def test_untyped_objects_are_walked_in_json():
    for detect in ('{"a": [1, NaN]}', '{"a": {"b": Infinity}}', '{"a": "%s"}' % ("x" * 5000), '{"a\\u0000": 1}'):
        with pytest.raises(ValidationError) as err:
            NodeFacts.model_validate_json('{"detect": %s}' % detect)
        assert err.value.errors()[0]["loc"] == ("detect",)
    assert NodeFacts.model_validate_json('{"detect": {"a": [1, 2.5, "x"]}}').detect == {"a": [1, 2.5, "x"]}


def test_models_built_in_python_are_not_walked():
    """The coordinator's own answers never fail on a stored value (e.g. an old row)."""
    facts = NodeFacts(detect={"why": "x\x00" + "y" * 5000})
    assert facts.detect["why"].startswith("x\x00")


def test_strict_json_keeps_datetimes_and_enums():
    raw = ('{"id": "t", "kind": "node", "reusable": false, "labels": {}, "created_at": "2026-01-01T00:00:00Z",'
           ' "expires_at": "2026-01-02T00:00:00+00:00"}')
    view = JoinTokenView.model_validate_json(raw, strict=True)
    assert view.kind is TokenKind.node and view.created_at.year == 2026
    with pytest.raises(ValidationError):
        JoinTokenView.model_validate_json(raw.replace("false", "0"), strict=True)
    assert JoinTokenView.model_validate_json(raw.replace("false", "0")).reusable is False  # clients: lax


@pytest.mark.parametrize("target", ["db:٣", "db:３", "db:²", "2001:db8::1:80", "db:0", "db :80"])
def test_tunnel_target_uses_the_one_host_port_rule(target):
    with pytest.raises(ValidationError):
        TunnelSpec(listen_port=5432, target=target)


def test_float_fields_refuse_nan_even_in_python():
    with pytest.raises(ValidationError):
        TransportStatus(last_handshake_age=float("nan"))
