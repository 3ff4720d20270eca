"""Local HTTP servers shaped like the Vast.AI and RunPod APIs (the only fakes: their APIs
cannot be reached from here). Field names and units as the providers document them."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

# Vast.AI bundles: gpu_ram/cpu_ram MB, dph_total USD/h, compute_cap x100, inet_* Mb/s, geolocation "Name, CC".
VAST_OFFERS: list[dict[str, Any]] = [
    dict(id=1001, machine_id=501, gpu_name="RTX 4090", num_gpus=2, gpu_ram=24564, gpu_totalram=49128,
         gpu_mem_bw=1008.0, total_flops=165.2, compute_cap=890, cuda_max_good=12.4, cpu_cores_effective=16.0,
         cpu_ram=64345, dph_total=0.95, inet_up=800.0, inet_down=1500.0, disk_space=250.0, disk_bw=2800.0,
         dlperf=120.5, reliability=0.995, verified=True, hosting_type=1, geolocation="Czechia, CZ", rentable=True),
    dict(id=1002, machine_id=502, gpu_name="RTX 3090", num_gpus=2, gpu_ram=24576, gpu_totalram=49152,
         gpu_mem_bw=936.0, total_flops=71.0, compute_cap=860, cuda_max_good=12.2, cpu_cores_effective=12.0,
         cpu_ram=32768, dph_total=0.61, inet_up=900.0, inet_down=1000.0, disk_space=100.0, disk_bw=1500.0,
         dlperf=70.1, reliability=0.99, verified=True, hosting_type=1, geolocation="Germany, DE", rentable=True),
    dict(id=1003, machine_id=503, gpu_name="RTX 4090", num_gpus=2, gpu_ram=24564, gpu_totalram=49128,
         gpu_mem_bw=1008.0, total_flops=165.0, compute_cap=890, cuda_max_good=12.4, cpu_cores_effective=16.0,
         cpu_ram=64345, dph_total=0.55, inet_up=500.0, inet_down=2000.0, disk_space=100.0, disk_bw=2000.0,
         dlperf=119.0, reliability=0.97, verified=False, hosting_type=0, geolocation="Sweden, SE", rentable=True),
    dict(id=1004, machine_id=504, gpu_name="RTX 4090", num_gpus=2, gpu_ram=24564, gpu_totalram=49128,
         gpu_mem_bw=1008.0, total_flops=165.0, compute_cap=890, cuda_max_good=12.4, cpu_cores_effective=32.0,
         cpu_ram=128000, dph_total=0.70, inet_up=1000.0, inet_down=5000.0, disk_space=500.0, disk_bw=3000.0,
         dlperf=121.0, reliability=0.999, verified=True, hosting_type=1, geolocation="California, US", rentable=True),
    dict(id=1005, machine_id=505, gpu_name="A100 SXM4", num_gpus=2, gpu_ram=81920, gpu_totalram=163840,
         gpu_mem_bw=2039.0, total_flops=39.0, compute_cap=800, cuda_max_good=12.2, cpu_cores_effective=32.0,
         cpu_ram=256000, dph_total=1.40, inet_up=1000.0, inet_down=1000.0, disk_space=500.0, disk_bw=3000.0,
         dlperf=200.0, reliability=0.999, verified=True, hosting_type=1, geolocation="Netherlands, NL", rentable=True),
    dict(id=1006, machine_id=506, gpu_name="RTX 4090", num_gpus=2, gpu_ram=24564, gpu_totalram=49128,
         gpu_mem_bw=1008.0, total_flops=165.0, compute_cap=890, cuda_max_good=12.4, cpu_cores_effective=16.0,
         cpu_ram=65536, dph_total=1.80, inet_up=1000.0, inet_down=3000.0, disk_space=500.0, disk_bw=3000.0,
         dlperf=121.0, reliability=0.999, verified=True, hosting_type=1, geolocation="Poland, PL", rentable=True),
]

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
            return web.json_response({"success": False, "error": "invalid_api_key"}, status=401)
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
    """gpuTypes (prices USD/h per GPU, memoryInGb) and dataCenters with gpuAvailability."""
    def lowest(stock):
        return {"stockStatus": stock, "minVcpu": 8 * gpu_count, "minMemory": 31 * gpu_count,
                "uninterruptablePrice": 0.69}
    return {
        "gpuTypes": [
            {"id": "NVIDIA GeForce RTX 4090", "displayName": "RTX 4090", "memoryInGb": 24, "secureCloud": True,
             "communityCloud": True, "securePrice": 0.69, "communityPrice": 0.34, "maxGpuCount": 8,
             "lowestPrice": lowest("High")},
            {"id": "NVIDIA GeForce RTX 3090", "displayName": "RTX 3090", "memoryInGb": 24, "secureCloud": True,
             "communityCloud": True, "securePrice": 0.43, "communityPrice": 0.22, "maxGpuCount": 8,
             "lowestPrice": lowest("Low")},
            {"id": "NVIDIA H100 80GB HBM3", "displayName": "H100 SXM", "memoryInGb": 80, "secureCloud": True,
             "communityCloud": False, "securePrice": 2.99, "communityPrice": None, "maxGpuCount": 8,
             "lowestPrice": lowest("Medium")},
            {"id": "NVIDIA RTX A6000", "displayName": "RTX A6000", "memoryInGb": 48, "secureCloud": True,
             "communityCloud": True, "securePrice": 0.76, "communityPrice": 0.49, "maxGpuCount": 8,
             "lowestPrice": lowest(None)},  # out of stock everywhere
        ],
        "dataCenters": [
            {"id": "EU-RO-1", "name": "Romania", "location": "Europe", "gpuAvailability": [
                {"gpuTypeId": "NVIDIA GeForce RTX 4090", "stockStatus": "High", "available": True},
                {"gpuTypeId": "NVIDIA H100 80GB HBM3", "stockStatus": "Low", "available": True}]},
            {"id": "US-CA-2", "name": "California", "location": "United States", "gpuAvailability": [
                {"gpuTypeId": "NVIDIA GeForce RTX 4090", "stockStatus": "Medium", "available": True},
                {"gpuTypeId": "NVIDIA GeForce RTX 3090", "stockStatus": "Low", "available": True}]},
            {"id": "EU-SE-1", "name": "Sweden", "location": "Europe", "gpuAvailability": [
                {"gpuTypeId": "NVIDIA GeForce RTX 3090", "stockStatus": None, "available": False}]},
        ],
    }
