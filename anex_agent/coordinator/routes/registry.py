"""Route registry: every REST route is declared once, with its auth and models.

A route module provides ``setup(registry, ctx)`` and calls :meth:`RouteRegistry.add`.
The registry wires the aiohttp route, and does the common work for every route:
refuse a source with too many failed authentications (429, :mod:`anex_agent.coordinator.limits`),
authenticate (:mod:`anex_agent.coordinator.auth`; join routes: a join token in an ``Authorization: Bearer``
header is checked before the body is read, the body's token before the handler runs),
read the body within the route's ``body_limit`` (413), parse and validate the JSON body into ``request_model``
(422 problem naming each field), call the handler, serialise a returned pydantic model
(``status`` on success), count and time the request. ``/v1/openapi.json`` is generated
from the same declarations, so a route added by another module is documented
automatically.

Input rules, the same for every route:
* path parameters: at most :data:`PATH_PARAM_MAX` characters, no control characters
  (NUL included), else 400 naming the parameter;
* declared integer query parameters (:class:`QueryParam` with ``type="integer"``): ASCII
  digits within ``minimum``..``maximum``, else 400 naming the parameter; the parsed
  values are in :attr:`Call.query`;
* a body is ``Content-Type: application/json`` (charset utf-8 if given), else 415, and is
  validated in pydantic's strict mode: no coercion (``"reusable": 0`` is an error);
* a client that disconnects while its body is read is counted with status
  :data:`CLIENT_CLOSED` (499) and logged at debug, not as an error.

Handler contract: ``async def handler(call: Call) -> BaseModel | web.StreamResponse | None``
(None -> 204). Raise :class:`.problems.Problem` for errors.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ValidationError

from anex_agent import parse
from anex_agent.coordinator import credentials, limits, problems
from anex_agent.coordinator.auth import Auth, Principal, bearer, precheck_join
from anex_agent.errors import AnexError
from anex_agent.net.peer_log import peer_text

log = logging.getLogger(__name__)

Handler = Callable[["Call"], Awaitable[Any]]

JSON = "application/json"
PATH_PARAM_MAX = 253
CLIENT_CLOSED = 499  # the client went away before the answer (nginx's convention); counted, never sent
INT64_MAX = 2**63 - 1


class ClientClosed(AnexError):
    """The client closed the connection while the coordinator was reading its request."""


@dataclass
class Call:
    """What a handler gets."""

    request: web.Request
    ctx: Any  # anex_agent.coordinator.context.Coordinator
    principal: Principal
    body: BaseModel | None
    query: dict[str, Any] = field(default_factory=dict)  # declared integer query parameters, parsed

    def param(self, name: str) -> str:
        return self.request.match_info[name]


@dataclass(frozen=True)
class QueryParam:
    """A query parameter. ``type="integer"`` ones are parsed by the registry (ASCII digits,
    ``minimum``..``maximum``, 400 naming the parameter otherwise) into ``Call.query``,
    ``default`` when absent."""

    name: str
    type: str = "string"  # OpenAPI scalar type
    description: str = ""
    required: bool = False
    minimum: int = 0  # integer parameters only
    maximum: int = INT64_MAX
    default: int | None = None

    def schema(self) -> dict[str, Any]:
        if self.type != "integer":
            return {"type": self.type}
        out: dict[str, Any] = {"type": "integer", "minimum": self.minimum, "maximum": self.maximum}
        if self.default is not None:
            out["default"] = self.default
        return out


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Handler
    auth: Auth
    summary: str
    request_model: type[BaseModel] | None = None
    response_model: type[BaseModel] | None = None
    status: int = 200
    query: tuple[QueryParam, ...] = ()
    tags: tuple[str, ...] = ()
    websocket: bool = False
    content_type: str = "application/json"  # of the success response when not a model
    problems: tuple[int, ...] = ()  # further problem statuses the route may answer (for OpenAPI)
    name: str = field(default="")
    body_limit: int | None = None  # bytes; None: limits.JOIN_BODY_LIMIT for join routes, else DEFAULT_BODY_LIMIT
    token_kind: str | None = None  # join routes: the join token kind ("node" | "gateway") the body carries

    @property
    def max_body(self) -> int:
        if self.body_limit is not None:
            return self.body_limit
        return limits.JOIN_BODY_LIMIT if self.auth is Auth.join else limits.DEFAULT_BODY_LIMIT


class RouteRegistry:
    def __init__(self, app: web.Application, ctx: Any) -> None:
        self._app = app
        self._ctx = ctx
        self.routes: list[Route] = []

    def add(self, route: Route) -> None:
        if any(r.method == route.method and r.path == route.path for r in self.routes):
            raise ValueError(f"route {route.method} {route.path} is declared twice")
        if route.auth is Auth.join and route.token_kind is None:
            raise ValueError(f"join route {route.method} {route.path} must name its token_kind")
        self.routes.append(route)
        self._app.router.add_route(route.method, route.path, self._wrap(route), name=route.name or None)

    def _wrap(self, route: Route) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        ctx = self._ctx
        label = f"{route.method} {route.path}"
        observe = ctx.metrics.latency.labels(route=label).observe
        counters: dict[int, Any] = {}  # status -> labelled counter child (labels() is not free)

        def count(status: int) -> None:
            child = counters.get(status)
            if child is None:
                child = counters[status] = ctx.metrics.requests.labels(route=label, status=str(status))
            child.inc()

        async def endpoint(request: web.Request) -> web.StreamResponse:
            started = time.perf_counter()
            status = 500
            source = limits.source_of(request, ctx.settings.limits.trusted_proxies)
            presented = bearer(request)
            try:
                if route.auth is not Auth.public or presented is not None:
                    left = ctx.failed_auths.retry_after(source)
                    if left > 0 and not ctx.auth.known(presented):
                        raise limits.too_many(left)
                principal = await ctx.auth.authenticate(request, route.auth)
                _check_path(request)
                query = _parse_query(request, route.query)
                # a join token sent as bearer too is checked before a byte of the body is read; another
                # bearer (a client sending its admin token everywhere) is no join token and is ignored here
                join_bearer = presented if route.auth is Auth.join and _is_join_token(presented) else None
                if join_bearer is not None:
                    await precheck_join(ctx.db, join_bearer, route.token_kind, now=ctx.clock())
                body = await _parse_body(request, route, ctx.settings.limits.body_timeout) if route.request_model else None
                if route.auth is Auth.join:
                    await _precheck_body_token(ctx, route, body, join_bearer)
                result = await route.handler(Call(request, ctx, principal, body, query))
                response = _to_response(result, route.status)
                status = response.status
                return response
            except problems.Problem as problem:
                status = problem.status
                if status == 401:
                    ctx.failed_auths.failed(source)
                raise
            except ClientClosed:
                # nothing to answer (aiohttp drops a response to a closed connection quietly),
                # nothing wrong with the coordinator
                status = CLIENT_CLOSED
                log.debug("client closed the connection during %s %s", peer_text(request.method), peer_text(request.path))
                return web.Response(status=CLIENT_CLOSED)
            except asyncio.CancelledError:  # aiohttp cancels a handler whose client went away
                status = CLIENT_CLOSED
                log.debug("request %s %s cancelled (client gone or shutdown)", peer_text(request.method), peer_text(request.path))
                raise
            finally:
                count(status)
                observe(time.perf_counter() - started)

        return endpoint


def _check_path(request: web.Request) -> None:
    for name, value in request.match_info.items():
        if len(value) > PATH_PARAM_MAX or not value.isprintable():
            raise problems.bad_request(
                f"path parameter {name} must be at most {PATH_PARAM_MAX} printable characters (no NUL or "
                "control characters)", field=name)


def _parse_query(request: web.Request, declared: tuple[QueryParam, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for q in declared:
        if q.type != "integer":
            continue
        raw = request.query.get(q.name)
        if raw is None:
            if q.required:
                raise problems.bad_request(f"query parameter {q.name} is required", field=q.name)
            out[q.name] = q.default
            continue
        try:
            out[q.name] = parse.integer(raw, minimum=q.minimum, maximum=q.maximum)
        except ValueError as err:
            raise problems.bad_request(f"query parameter {q.name} {err}", field=q.name) from None
    return out


def _is_join_token(secret: str | None) -> bool:
    return secret is not None and credentials.has_prefix(secret, credentials.JOIN_TOKEN)


async def _precheck_body_token(ctx: Any, route: Route, body: BaseModel | None, presented: str | None) -> None:
    """Join routes: the body's token must be a live join token of the route's kind (checked
    without a lock) and, when a bearer token was sent too, the same one."""
    secret = getattr(body, "token", None)
    if not isinstance(secret, str):
        raise problems.unauthenticated()
    if presented is not None:
        if not credentials.same_secret(secret, presented):
            raise problems.unauthenticated()
        return  # checked before the body was read
    await precheck_join(ctx.db, secret, route.token_kind, now=ctx.clock())


async def _parse_body(request: web.Request, route: Route, timeout: float) -> BaseModel:
    model = route.request_model
    assert model is not None
    if not request.body_exists:
        raise problems.bad_request(f"a JSON body ({model.__name__}) is required")
    charset = (request.charset or "utf-8").lower()
    if request.content_type != JSON or charset not in ("utf-8", "utf8"):
        got = request.headers.get("Content-Type", "")
        raise problems.unsupported_media_type(JSON, got[:100], f"UTF-8, a {model.__name__} object")
    try:
        raw = await limits.read_body(request, route.max_body, timeout=timeout, route=f"{route.method} {route.path}")
    except ConnectionResetError:
        raise ClientClosed() from None
    if not raw:
        raise problems.bad_request(f"a JSON body ({model.__name__}) is required")
    try:
        return model.model_validate_json(raw, strict=True)
    except ValidationError as err:
        if any(e["type"] == "json_invalid" for e in err.errors()):
            raise problems.bad_request(f"the body is not valid JSON; expected a {model.__name__} object") from None
        raise problems.from_validation_error(err) from None


def _to_response(result: Any, status: int) -> web.StreamResponse:
    if isinstance(result, web.StreamResponse):
        return result
    if result is None:
        return web.Response(status=204)
    if isinstance(result, BaseModel):
        return web.Response(status=status, body=result.model_dump_json().encode(), content_type="application/json")
    return web.Response(status=status, text=json.dumps(result), content_type="application/json")


# ---------------------------------------------------------------- OpenAPI

_PATH_PARAM = re.compile(r"\{(\w+)\}")
_PROBLEM_TEXT = {
    400: "bad request",
    415: "the body is not application/json",
    401: "missing or invalid credential/token",
    403: "the caller may not act on this object",
    409: "conflict with a concurrent change or another object; retry or fix the input",
    422: "invalid field(s), named in errors[]",
    429: "too many requests",
    503: "temporarily unavailable (network exhausted, database down)",
}


INPUT_RULES = (
    "Input rules of every route (beyond each schema's own limits): request bodies are application/json in "
    "UTF-8 (else 415) and are validated strictly, without type coercion (422 naming the field); no string "
    "anywhere in a body holds a NUL character or more than 4096 characters (fewer where the schema says "
    "so); numbers are finite (no NaN or Infinity); path parameters are at most 253 printable characters and "
    "integer query parameters are ASCII digits within their range (else 400 naming the parameter)."
)


@dataclass(frozen=True)
class ResponseRule:
    """One problem response a route documents when ``applies(route)``: what the registry
    itself may answer for every route of that shape (the route's own ``problems`` come after
    and win)."""

    applies: Callable[[Route], bool]
    status: int
    description: str | Callable[[Route], str]

    def describe(self, route: Route) -> str:
        return self.description if isinstance(self.description, str) else self.description(route)


def _has_body(route: Route) -> bool:
    return route.request_model is not None


def _has_params(route: Route) -> bool:
    return bool(_PATH_PARAM.search(route.path) or route.query)


def _bad_request(route: Route) -> str:
    params = "invalid path or query parameter, named in errors[]"
    if not _has_body(route):
        return params
    return f"malformed JSON, or an {params}" if _has_params(route) else "malformed JSON"


def _authenticates(route: Route) -> bool:
    return route.auth is not Auth.public


def _names_an_object(route: Route) -> bool:
    return "{" in route.path


RESPONSE_RULES: tuple[ResponseRule, ...] = (
    ResponseRule(lambda route: _has_body(route) or _has_params(route), 400, _bad_request),
    ResponseRule(_has_body, 415, _PROBLEM_TEXT[415]),
    ResponseRule(_has_body, 422, "invalid field(s), named in errors[] (strict types: no coercion)"),
    ResponseRule(_has_body, 413, lambda route: f"body larger than {route.max_body} bytes"),
    ResponseRule(_authenticates, 401, _PROBLEM_TEXT[401]),
    ResponseRule(_authenticates, 429, "too many failed authentications from this address; see Retry-After"),
    ResponseRule(_names_an_object, 404, "no such object"),
)


def openapi(routes: list[Route], *, title: str, version: str) -> dict[str, Any]:
    """An OpenAPI 3.1 document describing ``routes``: each route's success response, then
    the problem responses of :data:`RESPONSE_RULES` that apply to it, then its own ``problems``."""
    from pydantic.json_schema import models_json_schema

    from anex_agent.wire.problem import Problem as ProblemModel

    models: list[tuple[type[BaseModel], str]] = [(ProblemModel, "serialization")]
    for r in routes:
        if r.request_model:
            models.append((r.request_model, "validation"))
        if r.response_model:
            models.append((r.response_model, "serialization"))
    ref, schema = models_json_schema(list(dict.fromkeys(models)), ref_template="#/components/schemas/{model}")
    problem_content = {problems.CONTENT_TYPE: {"schema": ref[(ProblemModel, "serialization")]}}
    paths: dict[str, Any] = {}
    for r in routes:
        paths.setdefault(r.path, {})[r.method.lower()] = _operation(r, ref, problem_content)
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version, "description": INPUT_RULES},
        "paths": paths,
        "components": {
            "schemas": schema.get("$defs", {}),
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "admin token, node credential or gateway credential, per x-anex-auth",
                }
            },
        },
    }


SchemaRefs = dict[tuple[type[BaseModel], str], dict[str, Any]]  # (model, mode) -> {"$ref": ...}


def _operation(r: Route, ref: SchemaRefs, problem_content: dict[str, Any]) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": r.summary, "operationId": _operation_id(r)}
    if r.tags:
        op["tags"] = list(r.tags)
    if params := _parameters(r):
        op["parameters"] = params
    if r.request_model:
        op["requestBody"] = {"required": True, "content": {JSON: {"schema": ref[(r.request_model, "validation")]}}}
        op["x-anex-body-limit"] = r.max_body
    if r.websocket:
        op["description"] = "WebSocket (upgrade with GET); JSON text frames, each a " + (
            r.response_model.__name__ if r.response_model else "message"
        )
    responses = dict([_success(r, ref)])
    for rule in RESPONSE_RULES:
        if rule.applies(r):
            responses[str(rule.status)] = {"description": rule.describe(r), "content": problem_content}
    for status in r.problems:
        responses[str(status)] = {"description": _PROBLEM_TEXT.get(status, "problem"), "content": problem_content}
    op["responses"] = responses
    if r.auth not in (Auth.public, Auth.join):
        op["security"] = [{"bearer": []}]
        op["x-anex-auth"] = r.auth.value
    return op


def _parameters(r: Route) -> list[dict[str, Any]]:
    path = [
        {"name": name, "in": "path", "required": True,
         "schema": {"type": "string", "minLength": 1, "maxLength": PATH_PARAM_MAX}}
        for name in _PATH_PARAM.findall(r.path)
    ]
    query = [
        {"name": q.name, "in": "query", "required": q.required, "description": q.description, "schema": q.schema()}
        for q in r.query
    ]
    return path + query


def _success(r: Route, ref: SchemaRefs) -> tuple[str, dict[str, Any]]:
    """The success response: a WebSocket upgrade, a model, no content, or ``content_type``."""
    if r.websocket:
        return "101", {"description": "switching protocols to WebSocket"}
    if r.response_model:
        return str(r.status), {"description": "success",
                               "content": {JSON: {"schema": ref[(r.response_model, "serialization")]}}}
    if r.status == 204:
        return "204", {"description": "no content"}
    return str(r.status), {"description": "success", "content": {r.content_type: {"schema": {}}}}


def _operation_id(route: Route) -> str:
    words = re.sub(r"[{}]", "", route.path).strip("/").replace("-", "_").split("/")
    return "_".join([route.method.lower(), *[w for w in words if w and w != "v1"]])
