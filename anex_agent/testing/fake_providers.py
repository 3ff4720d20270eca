"""Fake Vast.AI and RunPod servers (aiohttp) shaped from their published APIs, with fault
injection: for tests of the rental clients and the provisioning loop, and for the demo's
simulated provider.

Routes and bodies:

* :class:`FakeVastAI` (base URL ``<url>/api/v0``): ``GET /bundles/?q=...`` -> ``{"offers":
  [...]}`` (its ``bundles``, the rented ones left out; the selection filters them again);
  ``PUT /asks/{offer_id}/`` ->
  ``{"success": true, "new_contract": <id>}``; a taken or unknown offer is 400
  ``{"success": false, "error": "no_such_ask", "msg": ...}``; ``DELETE /instances/{id}/`` ->
  ``{"success": true}``, 404 ``no_such_instance`` when gone; ``GET /instances/`` ->
  ``{"instances": [{"id", "label", "actual_status", "intended_status", "cur_state",
  "dph_total", "machine_id", "gpu_name", "num_gpus", "image_uuid"}]}``.
* :class:`FakeRunPod` (base URL ``<url>/v1``; offers at ``<url>/graphql``): ``POST /graphql``
  answers the selection's ``gpuTypes``/``dataCenters`` query from its ``gpu_types`` in its
  ``datacenters``; ``POST /pods`` -> 201 Pod ``{"id", "name",
  "desiredStatus", "costPerHr", "adjustedCostPerHr", "machineId", "gpuCount", "image", "env"}``;
  a refused offer is 400 ``{"error": ..., "status": 400}``; ``DELETE /pods/{id}`` -> 204, 404
  when gone; ``GET /pods`` -> a JSON array of Pods. Saved registry logins:
  ``POST /containerregistryauth`` ``{"name", "username", "password"}`` -> ``{"id", "name"}`` (a name
  taken: 400), ``GET /containerregistryauth`` -> ``[{"id", "name"}]``, ``DELETE
  /containerregistryauth/{id}`` -> 204; a pod naming an unknown ``containerRegistryAuthId`` is 400.
* Vast.AI's ``image_login`` (a private image's registry login) must be ``docker login``'s
  arguments, ``-u USER -p PASSWORD SERVER`` (else 400); it stays in the rental's ``body``.
* Both want ``Authorization: Bearer <api_key>`` (else 401) when an ``api_key`` is set.

Faults (each counts down and then the server behaves again):

* :meth:`refuse` an offer (400 with the provider's error body, for ever);
* :meth:`fail` ``rent``/``destroy``/``list`` the next ``times`` calls with a status (429 with
  ``Retry-After``, 500, 503, ...) before acting;
* :meth:`lose_answer` of the next ``times`` rents: the rental is made, then the answer is a 500
  (the caller must list before renting again);
* :meth:`vanish` a rental (the host reclaimed it: gone without a destroy);
* :meth:`no_capacity` for the next ``times`` rents: a 500 saying no machine is available
  (RunPod's answer when the stock ran out; nothing is rented);
* :meth:`interrupt` a rental (outbid or preempted: Vast.AI lists it ``actual_status`` ``exited``,
  ``intended_status`` ``stopped``, ``status_msg`` saying it was outbid; RunPod ``desiredStatus``
  ``EXITED``); it stays listed until destroyed, as the providers do;
* ``boot_status``: the status of a new rental (``running``; ``loading``: a machine that never
  boots) and :meth:`set_status` of one rental.

Interruptible capacity: a Vast.AI rent whose body carries ``price`` (a bid) and a RunPod pod
created with ``"interruptible": true`` are recorded as interruptible (``FakeRental.interruptible``,
``bid``); RunPod lists them with ``"interruptible": true``, Vast.AI with ``is_bid``.

Serving: ``await fake.start()`` on the caller's event loop, or :class:`ThreadedFake` on a
thread of its own (a synchronous caller, or a test that blocks its own loop), on TCP or a
Unix socket.

Hooks: ``on_rent(rental)`` and ``on_destroy(rental)`` (plain or async callables) run when a
rental is made (before the answer) and destroyed; the demo's simulated provider starts and
stops the machine there. Every call is recorded in ``calls`` as ``(method, path)``.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import re
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

Hook = Callable[["FakeRental"], Awaitable[None] | None]
OPERATIONS = ("rent", "destroy", "list")
_DOCKER_LOGIN = re.compile(r"-u \S+ -p \S+ \S+")


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
    intended_status: str = "running"
    status_msg: str = ""
    interruptible: bool = False
    bid: float | None = None  # Vast.AI: the bid of an interruptible instance, USD/hour


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
    no_capacity: int = 0

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
        self.boot_status = "running"  # the status of a new rental
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

    def no_capacity(self, times: int = 1) -> None:
        """The next ``times`` rents answer 500 saying no machine is available, and rent nothing."""
        self.faults.no_capacity += times

    def lose_answer(self, times: int = 1) -> None:
        """The next ``times`` rents create the rental, then answer 500 (the answer is lost)."""
        self.faults.lost_answers += times

    def set_status(self, rental_id: str, status: str) -> FakeRental:
        """The provider reports the rental ``status`` (``running``, ``loading``, ...)."""
        rental = self.rentals[str(rental_id)]
        rental.status = status
        return rental

    def interrupt(self, rental_id: str) -> FakeRental:
        """Outbid (Vast.AI) or preempted (RunPod): the machine stops and stays listed, stopped."""
        rental = self.rentals[str(rental_id)]
        rental.status, rental.intended_status = "exited", "stopped"
        rental.status_msg = "Instance outbid: a higher bid took the machine"
        return rental

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

    async def start(self, host: str = "127.0.0.1", port: int = 0, *, unix_path: str | None = None) -> str:
        """Serve on ``host:port`` (0: a free port) or on the Unix socket ``unix_path``; return the API
        base URL (for a Unix socket: its path only, ``<base path>``)."""
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        if unix_path is not None:
            await web.UnixSite(self._runner, unix_path).start()
            self.url = self.base_path()
            return self.url
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
        if self.faults.no_capacity > 0:
            self.faults.no_capacity -= 1
            return None, self.error(500, "There are no longer any instances available with the requested "
                                         "specifications. Please refresh and try again.", "no_capacity")
        rental = FakeRental(str(next(self._ids)), offer_id, label, image, env, onstart, command,
                            self.prices.get(offer_id, self.default_price), body, status=self.boot_status)
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

    def __init__(self, *, offers: set[str] | None = None, bundles: list[dict] | None = None,
                 exclusive: bool = True, **kwargs: Any) -> None:
        """``bundles``: the offers the search answers (:func:`vast_bundle`), also the ones that can be
        rented when ``offers`` is None; ``exclusive``: a rented offer is taken (searched no more,
        refused to a second rent)."""
        super().__init__(**kwargs)
        self.bundles = list(bundles or [])
        self.offers = offers if offers is not None or not self.bundles else {str(b["id"]) for b in self.bundles}
        self.exclusive = exclusive
        self.rented_offers: set[str] = set()
        for bundle in self.bundles:
            self.prices.setdefault(str(bundle["id"]), float(bundle.get("dph_total", self.default_price)))
        self.machines = {str(b["id"]): b.get("machine_id") for b in self.bundles}

    def base_path(self) -> str:
        return "/api/v0"

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/api/v0/bundles/", self._bundles),
                web.put("/api/v0/asks/{offer_id}/", self._rent),
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
        login = body.get("image_login")
        if login is not None and (not isinstance(login, str) or not _DOCKER_LOGIN.fullmatch(login)):
            return self.error(400, "image_login must be docker login's arguments: -u USER -p PASSWORD SERVER",
                              "invalid_args")
        if (self.offers is not None and offer_id not in self.offers) or \
                (self.exclusive and offer_id in self.rented_offers):
            return web.json_response(self.refusal_body(400), status=400)  # unknown, or taken (by us too)
        variables = {k: v for k, v in env.items() if not k.startswith("-")}
        rental, response = await self._create(offer_id, str(body.get("label") or ""), str(body["image"]), variables,
                                              body.get("onstart"), [str(a) for a in body.get("args") or []], body)
        if rental is not None:
            self.rented_offers.add(offer_id)
            if isinstance(body.get("price"), (int, float)) and not isinstance(body.get("price"), bool):
                rental.interruptible, rental.bid = True, float(body["price"])
        if response is not None:
            return response
        assert rental is not None
        return web.json_response({"success": True, "new_contract": int(rental.rental_id)})

    async def _bundles(self, request: web.Request) -> web.Response:
        return web.json_response({"offers": [dict(b, rented=False) for b in self.bundles
                                             if not (self.exclusive and str(b["id"]) in self.rented_offers)]})

    async def _delete(self, request: web.Request) -> web.Response:
        instance = self.rentals.get(request.match_info["instance_id"])
        gone, response = await self._destroy(request.match_info["instance_id"])
        if gone and instance is not None:
            self.rented_offers.discard(instance.offer_id)
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
            {"id": int(r.rental_id), "label": r.label, "actual_status": r.status,
             "intended_status": r.intended_status, "status_msg": r.status_msg or None, "is_bid": r.interruptible,
             "cur_state": "stopped" if r.intended_status == "stopped" else "running",  # the contract's state
             "dph_total": r.price_per_hour,
             "machine_id": self.machines.get(r.offer_id) or 70000 + int(r.rental_id) % 1000,
             "gpu_name": "RTX 4090", "num_gpus": 1, "image_uuid": r.image}
            for r in self.rentals.values()]})


class FakeRunPod(_FakeProvider):
    """RunPod's REST ``/v1`` pod routes. A rent's offer id is rebuilt from the body as the
    selection spells it: ``<gpuTypeIds[0]>@<dataCenterIds[0]>/<cloudType>/x<gpuCount>``."""

    name = "runpod"

    def __init__(self, *, gpu_types: list[dict] | None = None, datacenters: tuple[str, ...] = ("EU-RO-1",),
                 **kwargs: Any) -> None:
        """``gpu_types``: what the offer query answers (:func:`runpod_gpu_type`), in stock in every
        one of ``datacenters``."""
        super().__init__(**kwargs)
        self.gpu_types = list(gpu_types or [])
        self.datacenters = datacenters
        self.registry_auths: dict[str, dict[str, str]] = {}  # id -> saved login (the password is never listed)
        for gpu in self.gpu_types:
            for dc in datacenters:
                for tier, price in (("SECURE", gpu.get("securePrice")), ("COMMUNITY", gpu.get("communityPrice"))):
                    if price:
                        for count in range(1, 9):
                            self.prices.setdefault(f"{gpu['id']}@{dc}/{tier}/x{count}", float(price) * count)

    @property
    def graphql_url(self) -> str:
        """The offer query's endpoint (``ANEX_RUNPOD_URL``)."""
        return self.url[: -len(self.base_path())] + "/graphql"

    def base_path(self) -> str:
        return "/v1"

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/graphql", self._graphql), web.post("/v1/pods", self._rent), web.delete("/v1/pods/{pod_id}", self._delete),
                web.get("/v1/pods", self._list),
                web.get("/v1/containerregistryauth", self._list_auths),
                web.post("/v1/containerregistryauth", self._save_auth),
                web.delete("/v1/containerregistryauth/{auth_id}", self._delete_auth)]

    async def _list_auths(self, request: web.Request) -> web.Response:
        return web.json_response([{"id": a["id"], "name": a["name"]} for a in self.registry_auths.values()])

    async def _save_auth(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.text())
        except ValueError:
            return self.error(400, "body is not JSON")
        if not isinstance(body, dict) or not all(isinstance(body.get(k), str) and body[k]
                                                 for k in ("name", "username", "password")):
            return self.error(400, "name, username and password are required")
        if any(a["name"] == body["name"] for a in self.registry_auths.values()):
            return self.error(400, f"a container registry auth named {body['name']} already exists")
        auth_id = f"cra{next(self._ids)}"
        self.registry_auths[auth_id] = {"id": auth_id, "name": body["name"], "username": body["username"],
                                        "password": body["password"]}
        return web.json_response({"id": auth_id, "name": body["name"]})

    async def _delete_auth(self, request: web.Request) -> web.Response:
        if self.registry_auths.pop(request.match_info["auth_id"], None) is None:
            return self.error(404, "container registry auth not found")
        return web.Response(status=204)

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
                "image": rental.image, "env": rental.env, "interruptible": rental.interruptible}

    async def _graphql(self, request: web.Request) -> web.Response:
        injected = self._injected("list")
        if injected is not None:
            return injected
        in_stock = [{"gpuTypeId": g["id"], "stockStatus": "High", "available": True} for g in self.gpu_types]
        return web.json_response({"data": {
            "gpuTypes": self.gpu_types,
            "dataCenters": [{"id": dc, "name": dc, "location": dc, "gpuAvailability": in_stock}
                            for dc in self.datacenters]}})

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
        auth_id = body.get("containerRegistryAuthId")
        if auth_id is not None and auth_id not in self.registry_auths:
            return self.error(400, f"container registry auth {auth_id} not found")
        entry = body.get("dockerEntrypoint") or []
        onstart = entry[2] if len(entry) == 3 and entry[:2] == ["/bin/sh", "-c"] else None
        rental, response = await self._create(self.offer_of(body), str(body["name"]), str(body["imageName"]),
                                              dict(env), onstart, [str(a) for a in body.get("dockerStartCmd") or []],
                                              body)
        if rental is not None and body.get("interruptible") is True:
            rental.interruptible = True
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


def vast_bundle(offer_id: int, *, machine_id: int | None = None, price: float = 0.3, gpu: str = "RTX 4090",
                gpus: int = 1) -> dict:
    """One Vast.AI search result (``GET /bundles/``), with the fields the selection reads."""
    return {"id": offer_id, "machine_id": machine_id if machine_id is not None else 500 + offer_id,
            "gpu_name": gpu, "num_gpus": gpus, "gpu_ram": 24564, "gpu_totalram": 24564 * gpus,
            "gpu_mem_bw": 1008.0, "total_flops": 82.6 * gpus, "compute_cap": 890, "cuda_max_good": 12.4,
            "cpu_cores": 32, "cpu_cores_effective": 16.0, "cpu_ram": 64345, "dph_total": price, "inet_up": 800.0,
            "inet_down": 1500.0, "disk_space": 250.0, "disk_bw": 2800.0, "dlperf": 60.0, "verified": True,
            "verification": "verified", "hosting_type": 1, "geolocation": "Czechia, CZ", "reliability": 0.995,
            "rentable": True, "rented": False}


def runpod_gpu_type(gpu_id: str = "NVIDIA GeForce RTX 4090", *, display: str = "RTX 4090", price: float = 0.34,
                    memory_gb: int = 24) -> dict:
    """One entry of the offer query's ``gpuTypes`` (secure and community tiers at ``price`` per GPU)."""
    return {"id": gpu_id, "displayName": display, "memoryInGb": memory_gb, "secureCloud": True,
            "communityCloud": True, "securePrice": price, "communityPrice": round(price * 0.8, 4), "maxGpuCount": 8,
            "lowestPrice": {"stockStatus": "High", "minVcpu": 8, "minMemory": 48, "uninterruptablePrice": price}}


class ThreadedFake:
    """A fake provider served by an event loop on a thread of its own. Its hooks run on that loop;
    a blocking hook should hand its work to a thread (``loop.run_in_executor``)."""

    def __init__(self, fake: _FakeProvider) -> None:
        self.fake = fake
        self.loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None

    def start(self, host: str = "127.0.0.1", port: int = 0, *, unix_path: str | None = None) -> str:
        """Serve; return the API base URL (``fake.url``)."""
        self._thread = threading.Thread(target=self.loop.run_forever, name=f"fake-{self.fake.name}", daemon=True)
        self._thread.start()
        return self.call(self.fake.start(host, port, unix_path=unix_path))

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        """Run ``coro`` on the fake's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if self._thread is None:
            return
        self.call(self.fake.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self._thread = None
        self.loop.close()


__all__ = ["FakeRental", "FakeRunPod", "FakeVastAI", "ThreadedFake", "runpod_gpu_type", "vast_bundle"]
