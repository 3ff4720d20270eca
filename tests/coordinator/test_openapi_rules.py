"""The OpenAPI builder: every route of a shape documents the same responses, from one table.

These routes cover each shape the registry knows (body and path parameters, query only,
no content, plain text, WebSocket, join). The expected responses were the document's
before the builder became table-driven, except where it was wrong: a public route that
lists 401 says what 401 means (it said "problem"), and a body route with path parameters
documents that 400 also answers a bad parameter.
"""

from __future__ import annotations

import pytest

from anex_agent.wire.gateways import PeerSet
from anex_agent.wire.heartbeat import Heartbeat, HeartbeatAck
from anex_agent.wire.watch import WatchEvent
from anex_agent.coordinator import limits
from anex_agent.coordinator.auth import Auth
from anex_agent.coordinator.routes.registry import QueryParam, Route, openapi


async def _handler(call):
    return None


ROUTES = [
    Route("POST", "/v1/things/{thing_id}", _handler, Auth.admin, "body and path", request_model=Heartbeat,
          response_model=HeartbeatAck, problems=(403, 409)),
    Route("GET", "/v1/things", _handler, Auth.node_or_admin, "query",
          query=(QueryParam("since", type="integer", default=0), QueryParam("label", description="x")),
          response_model=PeerSet, tags=("a", "b")),
    Route("DELETE", "/v1/things/{thing_id}", _handler, Auth.admin, "no content", status=204),
    Route("GET", "/metrics-like", _handler, Auth.public, "text", content_type="text/plain", problems=(401, 429)),
    Route("GET", "/v1/ws/{x}", _handler, Auth.node_or_gateway, "ws", websocket=True,
          response_model=WatchEvent, problems=(400, 422)),
    Route("POST", "/v1/joinish", _handler, Auth.join, "join", request_model=Heartbeat, status=201,
          token_kind="node", body_limit=1234, problems=(418,)),
    Route("GET", "/healthz-like", _handler, Auth.public, "public, nothing to check"),
]

AUTH_401 = "missing or invalid credential/token"
AUTH_429 = "too many failed authentications from this address; see Retry-After"
BODY = {
    "415": "the body is not application/json",
    "422": "invalid field(s), named in errors[] (strict types: no coercion)",
}
PARAMS = "invalid path or query parameter, named in errors[]"

EXPECTED = {
    ("post", "/v1/things/{thing_id}"): {
        "200": "success", "400": f"malformed JSON, or an {PARAMS}", **BODY, "413": f"body larger than {limits.DEFAULT_BODY_LIMIT} bytes",
        "401": AUTH_401, "429": AUTH_429, "404": "no such object", "403": "the caller may not act on this object",
        "409": "conflict with a concurrent change or another object; retry or fix the input",
    },
    ("get", "/v1/things"): {"200": "success", "400": PARAMS, "401": AUTH_401, "429": AUTH_429},
    ("delete", "/v1/things/{thing_id}"): {
        "204": "no content", "400": PARAMS, "401": AUTH_401, "429": AUTH_429, "404": "no such object",
    },
    ("get", "/metrics-like"): {"200": "success", "401": AUTH_401, "429": "too many requests"},
    ("get", "/v1/ws/{x}"): {
        "101": "switching protocols to WebSocket", "400": "bad request", "401": AUTH_401, "429": AUTH_429,
        "404": "no such object", "422": "invalid field(s), named in errors[]",
    },
    ("post", "/v1/joinish"): {
        "201": "success", "400": "malformed JSON", **BODY, "413": "body larger than 1234 bytes",
        "401": AUTH_401, "429": AUTH_429, "418": "problem",
    },
    ("get", "/healthz-like"): {"200": "success"},
}


@pytest.fixture(scope="module")
def doc():
    return openapi(ROUTES, title="t", version="v")


def test_each_shape_documents_its_responses(doc):
    got = {(m, p): {s: r["description"] for s, r in op["responses"].items()}
           for p, ops in doc["paths"].items() for m, op in ops.items()}
    assert got == EXPECTED


def test_problem_responses_are_problem_json_and_success_bodies_are_typed(doc):
    things = doc["paths"]["/v1/things/{thing_id}"]["post"]
    for status, response in things["responses"].items():
        if status != "200":
            assert list(response["content"]) == ["application/problem+json"]
    assert things["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/HeartbeatAck")
    assert things["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/Heartbeat")
    assert doc["paths"]["/metrics-like"]["get"]["responses"]["200"]["content"] == {"text/plain": {"schema": {}}}
    assert "content" not in doc["paths"]["/v1/things/{thing_id}"]["delete"]["responses"]["204"]


def test_auth_body_limit_and_parameters(doc):
    things = doc["paths"]["/v1/things/{thing_id}"]["post"]
    assert things["security"] == [{"bearer": []}] and things["x-anex-auth"] == "admin"
    assert things["x-anex-body-limit"] == limits.DEFAULT_BODY_LIMIT
    join = doc["paths"]["/v1/joinish"]["post"]
    assert "security" not in join and "x-anex-auth" not in join and join["x-anex-body-limit"] == 1234
    assert "security" not in doc["paths"]["/metrics-like"]["get"]
    listed = doc["paths"]["/v1/things"]["get"]
    assert listed["tags"] == ["a", "b"] and listed["operationId"] == "get_things"
    assert listed["parameters"] == [
        {"name": "since", "in": "query", "required": False, "description": "",
         "schema": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1, "default": 0}},
        {"name": "label", "in": "query", "required": False, "description": "x", "schema": {"type": "string"}},
    ]
    ws = doc["paths"]["/v1/ws/{x}"]["get"]
    assert ws["description"].endswith("each a WatchEvent")
    assert ws["parameters"][0]["schema"] == {"type": "string", "minLength": 1, "maxLength": 253}
