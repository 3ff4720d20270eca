"""An in-memory rental provider and selector for the provisioning loop's tests, and a harness.

:class:`FakeRentals` keeps the :mod:`anex_agent.providers.rentals` contract
(labels, idempotent destroy, listing by label prefix) and takes faults per call:
``faults["rent"]`` is a list consumed one per rent call: ``"refuse"`` (RentRefused),
``"unavailable"`` (ProviderUnavailable, nothing rented), ``"rent-then-unavailable"`` (the
rental is made but the answer is lost), ``"key-refused"`` (KeyRefused), ``"no-capacity"``
(NoCapacity, nothing rented), ``None`` (normal). Same for ``"destroy"`` and
``"list"`` with ``"unavailable"``. ``boot_status``: the status of new rentals (``loading``: a
machine that never boots); :meth:`FakeRentals.interrupt`: outbid (stopped, still listed);
``alive_at_rent``: how many of its rentals were alive at each rent call (never two per provision).
"""

from __future__ import annotations

import asyncio
import time
import types
from dataclasses import dataclass, field

from aiohttp.test_utils import TestServer

from anex_agent.wire import keys
from anex_agent.wire.heartbeat import Heartbeat
from anex_agent.coordinator.app import build_app
from anex_agent.coordinator.context import Coordinator
from anex_agent.coordinator.routes.modules import ROUTE_MODULES, load_modules
from anex_agent.coordinator.provisioning.config import ProvisioningSettings
from anex_agent.providers.rentals import (
    KeyRefused, NoCapacity, ProviderUnavailable, Rental, RentRefused, RentRequest,
)
from anex_agent.coordinator.provisioning.selector import Candidate, Choice
from anex_agent.coordinator.routes import provisions
from anex_agent.coordinator.settings import Settings
from tests.coordinator.conftest import Harness
from tests.sqlite_schema import migrated


class ShiftClock:
    """The real time plus an offset the test moves (deadlines pass without waiting)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


@dataclass
class FakeRentals:
    name: str = "vastai"
    rentals: dict[str, Rental] = field(default_factory=dict)
    requests: dict[str, RentRequest] = field(default_factory=dict)
    rent_calls: list[str] = field(default_factory=list)  # offer ids asked for
    destroyed: list[str] = field(default_factory=list)
    faults: dict[str, list] = field(default_factory=lambda: {"rent": [], "destroy": [], "list": []})
    prices: dict[str, float] = field(default_factory=dict)
    boot_status: str = "running"
    alive_at_rent: list[int] = field(default_factory=list)
    _n: int = 0

    def interrupt(self, rental_id: str) -> None:
        r = self.rentals[rental_id]
        self.rentals[rental_id] = Rental(r.provider, r.rental_id, r.label, r.offer_id, r.price_per_hour, "exited",
                                         {"intended_status": "stopped", "status_msg": "Instance outbid"})

    def set_status(self, rental_id: str, status: str) -> None:
        r = self.rentals[rental_id]
        self.rentals[rental_id] = Rental(r.provider, r.rental_id, r.label, r.offer_id, r.price_per_hour, status)

    def _fault(self, kind: str):
        return self.faults[kind].pop(0) if self.faults[kind] else None

    async def rent(self, request: RentRequest) -> Rental:
        await asyncio.sleep(0)
        self.rent_calls.append(request.offer_id)
        self.alive_at_rent.append(sum(r.label == request.label for r in self.rentals.values()))
        fault = self._fault("rent")
        if fault == "refuse":
            raise RentRefused(self.name, request.offer_id, "offer is no longer available")
        if fault == "unavailable":
            raise ProviderUnavailable(self.name, "503 Service Unavailable")
        if fault == "key-refused":
            raise KeyRefused(self.name, "renting: the API key was refused (HTTP 401); check the provider key")
        if fault == "no-capacity":
            raise NoCapacity(self.name, "HTTP 500: There are no longer any instances available")
        self._n += 1
        rental = Rental(self.name, f"r{self._n}", request.label, request.offer_id,
                        self.prices.get(request.offer_id, 0.5), self.boot_status)
        self.rentals[rental.rental_id] = rental
        self.requests[rental.rental_id] = request
        if fault == "rent-then-unavailable":
            raise ProviderUnavailable(self.name, "502 Bad Gateway after the rental was made")
        return rental

    async def destroy(self, rental_id: str) -> None:
        if self._fault("destroy") == "unavailable":
            raise ProviderUnavailable(self.name, "503 on destroy")
        if self.rentals.pop(rental_id, None) is not None:
            self.destroyed.append(rental_id)

    async def list_rentals(self, label_prefix: str) -> list[Rental]:
        if self._fault("list") == "unavailable":
            raise ProviderUnavailable(self.name, "503 on list")
        return [r for r in self.rentals.values() if r.label.startswith(label_prefix)]


@dataclass
class FakeSelector:
    """Candidates in a fixed order; offers already tried are skipped, as the live selector does."""

    candidates: list[Candidate]
    calls: int = 0

    async def select(self, annotations, *, providers, exclude) -> Choice:
        self.calls += 1
        left = [c for c in self.candidates if (c.provider, c.offer_id) not in set(exclude) and c.provider in providers]
        return Choice(left, "" if left else "no offers left")


def offers(*ids: str, provider: str = "vastai", price: float = 0.5) -> list[Candidate]:
    return [Candidate(provider, i, machine_id=f"m-{i}", price_per_hour=price) for i in ids]


FAST = ProvisioningSettings(coordinator_url="http://coordinator.test", boot_timeout=60, max_attempts=4,
                            reconcile_interval=3600, poll_interval=0.05, backoff=0.05, backoff_max=0.2,
                            rent_tries=4, lease=30, lost_after=2)


def modules_with(setup) -> list[types.ModuleType]:
    """The default route modules, the provisioning one replaced by ``setup`` (same migrations)."""
    custom = types.ModuleType("provisions_under_test")
    custom.setup = setup
    custom.MIGRATIONS = provisions.MIGRATIONS
    return [custom if m.__name__ == provisions.__name__ else m for m in load_modules(ROUTE_MODULES)]


async def start(tmp_path, database_url: str, clock: ShiftClock, providers: dict, selector, settings=FAST,
                agent_binaries: tuple = ()) -> Harness:
    """A coordinator app with the provisioning loop over ``providers`` and ``selector`` and the
    default boot issuer (``agent_binaries``: the ``--agent-binary`` files it serves)."""
    settings_c = Settings.for_tests(tmp_path, database_url, poll_interval=0.1, sweep_interval=3600,
                                    agent_binaries=tuple(agent_binaries))
    await migrated(settings_c.database_url)
    ctx = await Coordinator.open(settings_c, clock=clock, environ={})
    setup = provisions.make_setup(providers=providers, selector=selector, settings=settings, environ={})
    server = TestServer(build_app(ctx, modules_with(setup)))
    await server.start_server()
    harness = Harness(ctx, server, None, clock, [])  # type: ignore[arg-type]
    harness.admin = harness.client(admin_token=ctx.admin_token)
    return harness


async def boot_node(harness: Harness, request: RentRequest, *, heartbeat: bool = True):
    """Do what the agent on the rented machine does: join with the boot token, heartbeat."""
    pair = keys.KeyPair(keys.generate_private_key())
    client = harness.client()
    joined = await client.join(request.env["ANEX_JOIN_TOKEN"], pair, request.env["ANEX_NODE_NAME"],
                               request.env["ANEX_PROVIDER"])
    client.set_credential(joined.credential)
    if heartbeat:
        await client.heartbeat(joined.node_id, Heartbeat())
    return client, joined
