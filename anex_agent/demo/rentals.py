"""A simulated machine rental service: what the coordinator's simulated provider rents from.

The service speaks the routes :mod:`anex_agent.coordinator.provisioning.simulated` documents
(offers, rent, list by label prefix, destroy). It runs on its own thread with its own event
loop (:meth:`RentalService.start`), so a synchronous caller (the demo) and a test's event
loop can both use it. What a rental does is up to ``on_rent(rental)`` / ``on_destroy(rental)``
(the demo starts and stops a node namespace running the agent with the rental's environment;
tests play the agent themselves).

Fault injection (tests): ``faults["rent"|"destroy"|"list"]`` are lists consumed one per call,
each an HTTP status to answer instead (``400`` refuses the offer, ``429``/``503`` are the
provider being away) or ``"hang"`` (rent only: the rental is made, the answer never comes).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class SimRental:
    rental_id: str
    offer_id: str
    label: str
    price_per_hour: float
    request: dict[str, Any]
    status: str = "running"

    def view(self) -> dict[str, Any]:
        return {"rental_id": self.rental_id, "offer_id": self.offer_id, "label": self.label,
                "price_per_hour": self.price_per_hour, "status": self.status}


@dataclass
class RentalService:
    offers: list[dict[str, Any]] = field(default_factory=lambda: [
        {"offer_id": f"sim-{i}", "machine_id": f"sim-m{i}", "price_per_hour": round(0.2 + 0.1 * i, 2),
         "gpu_name": "RTX 4090", "gpu_count": 1} for i in range(1, 6)])
    on_rent: Callable[[SimRental], None] | None = None
    on_destroy: Callable[[SimRental], None] | None = None
    rentals: dict[str, SimRental] = field(default_factory=dict)
    destroyed: list[str] = field(default_factory=list)
    rent_calls: list[str] = field(default_factory=list)
    faults: dict[str, list] = field(default_factory=lambda: {"rent": [], "destroy": [], "list": []})
    url: str = ""
    _ids: Any = field(default_factory=lambda: itertools.count(1))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _fault(self, kind: str):
        with self._lock:
            return self.faults[kind].pop(0) if self.faults[kind] else None

    # ------------------------------------------------------------ routes

    async def _offers(self, _request: web.Request) -> web.Response:
        return web.json_response({"offers": self.offers})

    async def _rent(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.rent_calls.append(body["offer_id"])
        fault = self._fault("rent")
        if isinstance(fault, int):
            return web.json_response({"error": f"simulated {fault}"}, status=fault)
        offer = next((o for o in self.offers if o["offer_id"] == body["offer_id"]), None)
        if offer is None:
            return web.json_response({"error": "no such offer"}, status=400)
        with self._lock:
            rental = SimRental(f"sim-r{next(self._ids)}", body["offer_id"], body["label"], offer["price_per_hour"],
                               body)
            self.rentals[rental.rental_id] = rental
        if self.on_rent is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.on_rent, rental)
        if fault == "hang":
            await asyncio.sleep(3600)
        return web.json_response(rental.view(), status=201)

    async def _list(self, request: web.Request) -> web.Response:
        fault = self._fault("list")
        if isinstance(fault, int):
            return web.json_response({"error": f"simulated {fault}"}, status=fault)
        prefix = request.query.get("label_prefix", "")
        with self._lock:
            found = [r.view() for r in self.rentals.values() if r.label.startswith(prefix)]
        return web.json_response({"rentals": found})

    async def _destroy(self, request: web.Request) -> web.Response:
        fault = self._fault("destroy")
        if isinstance(fault, int):
            return web.json_response({"error": f"simulated {fault}"}, status=fault)
        with self._lock:
            rental = self.rentals.pop(request.match_info["rental_id"], None)
            if rental is not None:
                self.destroyed.append(rental.rental_id)
        if rental is None:
            return web.json_response({"error": "no such rental"}, status=404)
        if self.on_destroy is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.on_destroy, rental)
        return web.Response(status=204)

    def vanish(self, rental_id: str) -> None:
        """The host takes a machine back: the rental disappears without a destroy."""
        with self._lock:
            rental = self.rentals.pop(rental_id)
        if self.on_destroy is not None:
            self.on_destroy(rental)

    # ------------------------------------------------------------ lifecycle

    def start(self, host: str = "127.0.0.1", port: int = 0, *, unix_path: str | None = None) -> str:
        """Serve on a thread of its own; return the URL (``unix_path``: on that socket, URL empty)."""
        started = threading.Event()
        self._loop = asyncio.new_event_loop()

        async def serve() -> None:
            app = web.Application()
            app.router.add_get("/offers", self._offers)
            app.router.add_post("/rentals", self._rent)
            app.router.add_get("/rentals", self._list)
            app.router.add_delete("/rentals/{rental_id}", self._destroy)
            self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
            await self._runner.setup()
            if unix_path is not None:
                await web.UnixSite(self._runner, unix_path).start()
            else:
                await web.TCPSite(self._runner, host, port).start()
                bound = self._runner.addresses[0]
                self.url = f"http://{bound[0]}:{bound[1]}"
            started.set()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(serve())
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="rental-service", daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("the simulated rental service did not start")
        return self.url

    def stop(self) -> None:
        if getattr(self, "_thread", None) is None:
            return

        async def cleanup() -> None:
            await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._thread = None
