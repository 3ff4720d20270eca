"""Fake Vast.AI and RunPod servers (aiohttp) shaped from their published APIs, with fault
injection: for tests of the rental clients and the provisioning loop, and for the demo's
simulated provider.

Routes and bodies:

* :class:`FakeVastAI` (base URL ``<url>/api/v0``): ``PUT /asks/{offer_id}/`` ->
  ``{"success": true, "new_contract": <id>}``; a taken or unknown offer is 400
  ``{"success": false, "error": "no_such_ask", "msg": ...}``; ``DELETE /instances/{id}/`` ->
  ``{"success": true}``, 404 ``no_such_instance`` when gone; ``GET /instances/`` ->
  ``{"instances": [{"id", "label", "actual_status", "intended_status", "cur_state",
  "dph_total", "machine_id", "gpu_name", "num_gpus", "image_uuid"}]}``.
* :class:`FakeRunPod` (base URL ``<url>/v1``): ``POST /pods`` -> 201 Pod ``{"id", "name",
  "desiredStatus", "costPerHr", "adjustedCostPerHr", "machineId", "gpuCount", "image", "env"}``;
  a refused offer is 400 ``{"error": ..., "status": 400}``; ``DELETE /pods/{id}`` -> 204, 404
  when gone; ``GET /pods`` -> a JSON array of Pods.
* Both want ``Authorization: Bearer <api_key>`` (else 401) when an ``api_key`` is set.

Faults (each counts down and then the server behaves again):

* :meth:`refuse` an offer (400 with the provider's error body, for ever);
* :meth:`fail` ``rent``/``destroy``/``list`` the next ``times`` calls with a status (429 with
  ``Retry-After``, 500, 503, ...) before acting;
* :meth:`lose_answer` of the next ``times`` rents: the rental is made, then the answer is a 500
  (the caller must list before renting again);
* :meth:`vanish` a rental (the host reclaimed it: gone without a destroy).

Hooks: ``on_rent(rental)`` and ``on_destroy(rental)`` (plain or async callables) run when a
rental is made (before the answer) and destroyed; the demo's simulated provider starts and
stops the machine there. Every call is recorded in ``calls`` as ``(method, path)``.
"""

from __future__ import annotations

import inspect
import itertools
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

Hook = Callable[["FakeRental"], Awaitable[None] | None]
OPERATIONS = ("rent", "destroy", "list")


@dataclass
class FakeRental:
    """One rental the fake holds: what was asked for, and its state."""

    rental_id: str
    offer_id: str
    label: str
    image: str
    env: dict[str, str]
    onstart: str | None
    command: list[str]
    price_per_hour: float
    body: dict[str, Any]
    status: str = "running"
    handle: Any = None  # the hook's own state (e.g. the process it started)


@dataclass
class _Failure:
    status: int
    times: int
    retry_after: str | None = None


@dataclass
class _Faults:
    refused: dict[str, tuple[int, dict]] = field(default_factory=dict)
    failures: dict[str, list[_Failure]] = field(default_factory=dict)
    lost_answers: int = 0

    def next_failure(self, operation: str) -> _Failure | None:
        queue = self.failures.get(operation) or []
        while queue and queue[0].times <= 0:
            queue.pop(0)
        if not queue:
            return None
        queue[0].times -= 1
        return queue[0]


class _FakeProvider:
    name = "fake"

    def __init__(self, *, api_key: str = "", on_rent: Hook | None = None, on_destroy: Hook | None = None,
                 default_price: float = 0.5) -> None:
        self.api_key = api_key
        self.on_rent = on_rent
        self.on_destroy = on_destroy
        self.default_price = default_price
        self.prices: dict[str, float] = {}  # offer id -> USD/hour
        self.rentals: dict[str, FakeRental] = {}
        self.destroyed: list[str] = []
        self.calls: list[tuple[str, str]] = []
        self.faults = _Faults()
        self._ids = itertools.count(1000)
        self._runner: web.AppRunner | None = None
        self.url = ""

    # ---------------------------------------------------------------- faults

    def refuse(self, offer_id: str, status: int = 400, body: dict | None = None) -> None:
        """Every rent of ``offer_id`` answers ``status`` with the provider's error body."""
        self.faults.refused[str(offer_id)] = (status, body or self.refusal_body(status))

    def fail(self, operation: str, status: int, *, times: int = 1, retry_after: float | str | None = None) -> None:
        """The next ``times`` calls of ``operation`` (rent, destroy, list) answer ``status`` and do nothing."""
        assert operation in OPERATIONS, operation
        self.faults.failures.setdefault(operation, []).append(
            _Failure(status, times, None if retry_after is None else str(retry_after)))

    def lose_answer(self, times: int = 1) -> None:
        """The next ``times`` rents create the rental, then answer 500 (the answer is lost)."""
        self.faults.lost_answers += times

    def vanish(self, rental_id: str) -> FakeRental:
        """The rental disappears without a destroy (the host reclaimed the machine); no hook runs."""
        return self.rentals.pop(str(rental_id))

    def labelled(self, prefix: str = "") -> list[FakeRental]:
        return [r for r in self.rentals.values() if r.label.startswith(prefix)]

    # ---------------------------------------------------------------- serving

    def routes(self) -> list[web.RouteDef]:
        raise NotImplementedError

    def base_path(self) -> str:
        raise NotImplementedError

    def refusal_body(self, status: int) -> dict:
        raise NotImplementedError

    def error(self, status: int, message: str, code: str = "") -> web.Response:
        raise NotImplementedError

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware])
        app.add_routes(self.routes())
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve on ``host:port`` (0: a free port); return the API base URL."""
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound = self._runner.addresses[0]
        self.url = f"http://{host}:{bound[1]}{self.base_path()}"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> "_FakeProvider":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @web.middleware
    async def _middleware(self, request: web.Request, handler) -> web.StreamResponse:
        self.calls.append((request.method, request.path))
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return self.error(401, "invalid or missing API key", "not_authorized")
        return await handler(request)

    def _injected(self, operation: str) -> web.Response | None:
        failure = self.faults.next_failure(operation)
        if failure is None:
            return None
        response = self.error(failure.status, f"injected {failure.status}", "injected")
        if failure.retry_after is not None:
            response.headers["Retry-After"] = failure.retry_after
        return response

    async def _create(self, offer_id: str, label: str, image: str, env: dict, onstart: str | None,
                      command: list[str], body: dict) -> tuple[FakeRental | None, web.Response | None]:
        """The common part of a rent (after the injected failures): refusal, the rental, the hook,
        a lost answer."""
        if offer_id in self.faults.refused:
            status, error_body = self.faults.refused[offer_id]
            return None, web.json_response(error_body, status=status)
        rental = FakeRental(str(next(self._ids)), offer_id, label, image, env, onstart, command,
                            self.prices.get(offer_id, self.default_price), body)
        self.rentals[rental.rental_id] = rental
        await _call(self.on_rent, rental)
        if self.faults.lost_answers > 0:
            self.faults.lost_answers -= 1
            return rental, self.error(500, "internal error", "internal")
        return rental, None

    async def _destroy(self, rental_id: str) -> tuple[bool, web.Response | None]:
        injected = self._injected("destroy")
        if injected is not None:
            return False, injected
        rental = self.rentals.pop(rental_id, None)
        if rental is None:
            return False, None
        self.destroyed.append(rental_id)
        await _call(self.on_destroy, rental)
        return True, None


async def _call(hook: Hook | None, rental: FakeRental) -> None:
    if hook is None:
        return
    result = hook(rental)
    if inspect.isawaitable(result):
        await result


class FakeVastAI(_FakeProvider):
    """Vast.AI's ``/api/v0`` rental routes. ``offers``: the offer ids that can be rented (None: any number)."""

    name = "vastai"

    def __init__(self, *, offers: set[str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.offers = offers
        self.rented_offers: set[str] = set()

    def base_path(self) -> str:
        return "/api/v0"

    def routes(self) -> list[web.RouteDef]:
        return [web.put("/api/v0/asks/{offer_id}/", self._rent),
                web.delete("/api/v0/instances/{instance_id}/", self._delete),
                web.get("/api/v0/instances/", self._list)]

    def refusal_body(self, status: int) -> dict:
        return {"success": False, "error": "no_such_ask", "msg": "Instance type no longer available."}

    def error(self, status: int, message: str, code: str = "") -> web.Response:
        return web.json_response({"success": False, "error": code or "error", "msg": message}, status=status)

    async def _rent(self, request: web.Request) -> web.Response:
        offer_id = request.match_info["offer_id"]
        injected = self._injected("rent")
        if injected is not None:
            return injected
        try:
            body = json.loads(await request.text())
        except ValueError:
            return self.error(400, "body is not JSON", "invalid_args")
        if not isinstance(body, dict) or body.get("client_id") != "me" or not body.get("image"):
            return self.error(400, "client_id 'me' and image are required", "invalid_args")
        env = body.get("env") or {}
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            return self.error(400, "env must be an object of strings", "invalid_args")
        if (self.offers is not None and offer_id not in self.offers) or offer_id in self.rented_offers:
            return web.json_response(self.refusal_body(400), status=400)  # unknown, or taken (by us too)
        variables = {k: v for k, v in env.items() if not k.startswith("-")}
        rental, response = await self._create(offer_id, str(body.get("label") or ""), str(body["image"]), variables,
                                              body.get("onstart"), [str(a) for a in body.get("args") or []], body)
        if rental is not None:
            self.rented_offers.add(offer_id)
        if response is not None:
            return response
        assert rental is not None
        return web.json_response({"success": True, "new_contract": int(rental.rental_id)})

    async def _delete(self, request: web.Request) -> web.Response:
        gone, response = await self._destroy(request.match_info["instance_id"])
        if response is not None:
            return response
        if not gone:
            return self.error(404, "no such instance", "no_such_instance")
        return web.json_response({"success": True})

    async def _list(self, request: web.Request) -> web.Response:
        injected = self._injected("list")
        if injected is not None:
            return injected
        return web.json_response({"instances": [
            {"id": int(r.rental_id), "label": r.label, "actual_status": r.status, "intended_status": "running",
             "cur_state": r.status, "dph_total": r.price_per_hour, "machine_id": 70000 + int(r.rental_id) % 1000,
             "gpu_name": "RTX 4090", "num_gpus": 1, "image_uuid": r.image}
            for r in self.rentals.values()]})


class FakeRunPod(_FakeProvider):
    """RunPod's REST ``/v1`` pod routes. A rent's offer id is rebuilt from the body as the
    selection spells it: ``<gpuTypeIds[0]>@<dataCenterIds[0]>/<cloudType>/x<gpuCount>``."""

    name = "runpod"

    def base_path(self) -> str:
        return "/v1"

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/v1/pods", self._rent), web.delete("/v1/pods/{pod_id}", self._delete),
                web.get("/v1/pods", self._list)]

    def refusal_body(self, status: int) -> dict:
        return {"error": "There are no longer any instances available with the requested specifications. "
                         "Please refresh and try again.", "status": status}

    def error(self, status: int, message: str, code: str = "") -> web.Response:
        return web.json_response({"error": message, "status": status}, status=status)

    @staticmethod
    def offer_of(body: dict) -> str:
        gpus, dcs = body.get("gpuTypeIds") or ["?"], body.get("dataCenterIds") or ["?"]
        return f"{gpus[0]}@{dcs[0]}/{body.get('cloudType', 'SECURE')}/x{body.get('gpuCount', 1)}"

    def pod(self, rental: FakeRental) -> dict:
        return {"id": rental.rental_id, "name": rental.label, "desiredStatus": rental.status.upper(),
                "costPerHr": rental.price_per_hour, "adjustedCostPerHr": rental.price_per_hour,
                "machineId": f"m{rental.rental_id}", "gpuCount": rental.body.get("gpuCount", 1),
                "image": rental.image, "env": rental.env}

    async def _rent(self, request: web.Request) -> web.Response:
        injected = self._injected("rent")
        if injected is not None:
            return injected
        try:
            body = json.loads(await request.text())
        except ValueError:
            return self.error(400, "body is not JSON")
        if not isinstance(body, dict) or not body.get("imageName") or not body.get("name"):
            return self.error(400, "name and imageName are required")
        env = body.get("env") or {}
        if not isinstance(env, dict):
            return self.error(400, "env must be an object")
        entry = body.get("dockerEntrypoint") or []
        onstart = entry[2] if len(entry) == 3 and entry[:2] == ["/bin/sh", "-c"] else None
        rental, response = await self._create(self.offer_of(body), str(body["name"]), str(body["imageName"]),
                                              dict(env), onstart, [str(a) for a in body.get("dockerStartCmd") or []],
                                              body)
        if response is not None:
            return response
        assert rental is not None
        return web.json_response(self.pod(rental), status=201)

    async def _delete(self, request: web.Request) -> web.Response:
        gone, response = await self._destroy(request.match_info["pod_id"])
        if response is not None:
            return response
        if not gone:
            return self.error(404, "pod not found")
        return web.Response(status=204)

    async def _list(self, request: web.Request) -> web.Response:
        injected = self._injected("list")
        if injected is not None:
            return injected
        return web.json_response([self.pod(r) for r in self.rentals.values()])


__all__ = ["FakeRental", "FakeRunPod", "FakeVastAI"]
