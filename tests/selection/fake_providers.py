"""Local HTTP servers shaped like the Vast.AI and RunPod APIs (the only fakes: their APIs
cannot be reached from here). They answer from the reference answers in ``fixtures/`` (field
names and units as the providers document them); error bodies: Vast.AI
``{"success": false, "error": ..., "msg": ...}``, RunPod GraphQL ``{"errors": [{"message": ...}]}``."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

FIXTURES = Path(__file__).parent / "fixtures"

# The reference answers (tests/selection/fixtures/), one per provider; see docs/selection.md "Sources".
# Vast.AI bundles: gpu_ram/cpu_ram MB, dph_total USD/h, compute_cap x100, inet_* Mb/s, geolocation "Name, CC".
VAST_ANSWER: dict[str, Any] = json.loads((FIXTURES / "vastai_bundles.json").read_text())
VAST_OFFERS: list[dict[str, Any]] = VAST_ANSWER["offers"]
RUNPOD_ANSWER: dict[str, Any] = json.loads((FIXTURES / "runpod_gpu_types.json").read_text())  # gpuCount 2

_FIELD_ALIASES = {"datacenter": lambda o: o.get("hosting_type") == 1}


def vast_matches(offer: dict, query: dict) -> bool:
    """A subset of the bundles query language: eq / gte / lte / in on offer fields."""
    for name, cond in query.items():
        if not isinstance(cond, dict):
            continue  # order, limit, type
        value = _FIELD_ALIASES[name](offer) if name in _FIELD_ALIASES else offer.get(name)
        if name == "geolocation" and isinstance(value, str):
            value = value.rsplit(",", 1)[-1].strip()
        for op, arg in cond.items():
            if op == "eq" and value != arg:
                return False
            if op == "gte" and not (value is not None and value >= arg):
                return False
            if op == "lte" and not (value is not None and value <= arg):
                return False
            if op == "in" and value not in arg:
                return False
    return True


@dataclass
class FakeProvider:
    """Scripted behaviour: ``script`` is a list of (status, headers, delay) consumed one per request;
    when it is empty the normal answer is given."""

    api_key: str = "secret-key-123"
    script: list[tuple[int, dict, float]] = field(default_factory=list)
    requests: list[dict] = field(default_factory=list)
    vast_offers: list[dict] = field(default_factory=lambda: [dict(o, rented=False) for o in VAST_OFFERS])
    runpod_data: dict = field(default_factory=dict)
    graphql_errors: list | None = None
    fail_path: str | None = None  # every request to this path answers 502

    @web.middleware
    async def _fail(self, request: web.Request, handler):
        if request.path == self.fail_path:
            self.requests.append({"failed": request.path})
            return web.json_response({"error": "bad gateway"}, status=502)
        return await handler(request)

    async def _scripted(self) -> web.Response | None:
        if not self.script:
            return None
        status, headers, delay = self.script.pop(0)
        if delay:
            await asyncio.sleep(delay)
        if status == 200:
            return None
        return web.json_response({"error": "scripted"}, status=status, headers=headers)

    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {self.api_key}"

    async def bundles(self, request: web.Request) -> web.Response:
        query = json.loads(request.query.get("q", "{}"))
        self.requests.append({"query": query, "auth": request.headers.get("Authorization")})
        scripted = await self._scripted()
        if scripted is not None:
            return scripted
        if not self._authorized(request):
            return web.json_response({"success": False, "error": "auth_error", "msg": "Invalid API key"}, status=401)
        found = [o for o in self.vast_offers if vast_matches(o, query)]
        found.sort(key=lambda o: o["dph_total"])
        return web.json_response({"offers": found[: int(query.get("limit", 64))]})

    async def graphql(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append({"body": body, "auth": request.headers.get("Authorization")})
        scripted = await self._scripted()
        if scripted is not None:
            return scripted
        if not self._authorized(request):
            return web.json_response({"errors": [{"message": "Unauthorized"}]}, status=401)
        if self.graphql_errors:
            return web.json_response({"data": None, "errors": self.graphql_errors})
        return web.json_response({"data": self.runpod_data})

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._fail])
        app.router.add_get("/api/v0/bundles/", self.bundles)
        app.router.add_post("/graphql", self.graphql)
        return app


def runpod_data(gpu_count: int = 2) -> dict:
    """gpuTypes (prices USD/h per GPU, memoryInGb) and dataCenters with gpuAvailability: the reference
    answer's ``data``, with ``lowestPrice`` as RunPod gives it for ``gpuCount`` = ``gpu_count``."""
    data = copy.deepcopy(RUNPOD_ANSWER["data"])
    for gpu in data["gpuTypes"]:
        gpu["lowestPrice"].update(minVcpu=8 * gpu_count, minMemory=31 * gpu_count)
    return data
