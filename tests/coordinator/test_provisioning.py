"""The provisioning loop and /v1/provisions against a real coordinator app (SQLite and PostgreSQL),
with an in-memory rental provider and selector (tests/coordinator/provisioning_fakes.py).

Covered: 202 and idempotency by name (409 on another body), env validation naming the variable,
a refused first candidate -> the second rented, a provider unavailable after renting -> exactly
one rental (adopted), unavailable before renting -> retried, a node that never joins -> destroyed,
banned, next; max attempts -> failed; ready with node id and address; DELETE destroys the rental
then removes the node and is idempotent (also while the provider is briefly unavailable); a
dangling labelled rental is destroyed; a vanished rental -> lost and the node revoked; a restart
on the same database adopts the rental a dead coordinator made; cost in the view and /metrics;
changes on the provisions watch stream.
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from anex_agent.coordinator.provisioning import store
from anex_agent.providers.rentals import Rental, cluster_label_prefix, rental_label
from anex_agent.coordinator.routes.provisions import provisioner_of
from anex_agent.selection.bans import BanStore
from tests.coordinator.conftest import stop_harness
from tests.coordinator.provisioning_fakes import (
    FAST, FakeRentals, FakeSelector, ShiftClock, boot_node, offers, start,
)
from tests.polling import GENEROUS, wait_until

SPEC = {"name": "train-1", "image": "ghcr.io/acme/train:1", "command": ["python"], "args": ["train.py"],
        "env": {"GW_TUNNEL_5432": "db.default.svc.cluster.local:5432", "EPOCHS": "3"}, "ports": [8888],
        "annotations": {"anex.sh/gpu-count": "1"}}


async def scheduler_passes(harness, n: int) -> None:
    """Return once the provisioning scheduler made ``n`` more passes over the provisions (each
    pass ends by refreshing the metrics snapshot)."""
    loop = provisioner_of(harness.ctx)
    real = loop._refresh_metrics
    done = [0]

    async def counted(now):
        await real(now)
        done[0] += 1
    loop._refresh_metrics = counted
    try:
        await wait_until(lambda: done[0] >= n, what=f"{n} passes of the provisioning scheduler")
    finally:
        del loop._refresh_metrics


class Api:
    def __init__(self, harness) -> None:
        self.url = harness.url
        self.headers = {"Authorization": f"Bearer {harness.ctx.admin_token}"}

    async def call(self, method: str, path: str, body=None) -> tuple[int, dict]:
        async with aiohttp.ClientSession() as s:
            async with s.request(method, self.url + path, json=body, headers=self.headers) as r:
                return r.status, json.loads(await r.read() or b"{}")

    async def create(self, spec=SPEC) -> dict:
        status, body = await self.call("POST", "/v1/provisions", spec)
        assert status in (200, 202), body
        return body

    async def get(self, pid: str) -> dict:
        status, body = await self.call("GET", f"/v1/provisions/{pid}")
        assert status == 200, body
        return body

    async def until(self, pid: str, predicate, what: str, timeout: float = GENEROUS) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            view = await self.get(pid)
            if predicate(view):
                return view
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}; last view: {view}")

    async def state(self, pid: str, state: str, timeout: float = GENEROUS) -> dict:
        return await self.until(pid, lambda v: v["state"] == state, f"state {state}", timeout)


@pytest.fixture
def shift() -> ShiftClock:
    return ShiftClock()


async def _booting_request(api: Api, vast: FakeRentals, pid: str):
    view = await api.state(pid, "booting")
    return view, vast.requests[view["rental_id"]]


async def _ready_provision(harness, api: Api, vast: FakeRentals):
    """A provision created, rented, booted and ready: its id and the joined node."""
    pid = (await api.create())["id"]
    _view, request = await _booting_request(api, vast, pid)
    _client, joined = await boot_node(harness, request)
    await api.state(pid, "ready")
    return pid, joined


async def test_refused_first_candidate_then_second_rented_and_ready(tmp_path, database_url, shift):
    vast = FakeRentals()
    vast.faults["rent"] = ["refuse"]
    vast.prices["o2"] = 1.2
    harness = await start(tmp_path, database_url, shift, {"vastai": vast}, FakeSelector(offers("o1", "o2", "o3")))
    api = Api(harness)
    try:
        created = await api.call("POST", "/v1/provisions", SPEC)
        assert created[0] == 202 and created[1]["state"] == "selecting" and created[1]["name"] == "train-1"
        pid = created[1]["id"]
        view, request = await _booting_request(api, vast, pid)
        assert vast.rent_calls == ["o1", "o2"] and list(vast.rentals) == ["r1"]
        assert [a["outcome"] for a in view["attempts"]] == ["refused", None]
        assert view["attempts"][0]["reason"] == "offer is no longer available"
        # what the rented machine gets: the workload's env, the agent's boot variables, the command
        assert request.env["GW_TUNNEL_5432"] == "db.default.svc.cluster.local:5432"
        assert request.env["ANEX_COORDINATOR_URL"] == "http://coordinator.test"
        assert request.env["ANEX_JOIN_TOKEN"].startswith("anexjt_") and request.env["ANEX_PROVIDER"] == "vastai"
        assert request.command == ("python", "train.py") and request.ports == (8888,)
        assert request.label == rental_label(await store.cluster_id(harness.ctx.db), pid)
        _client, joined = await boot_node(harness, request)
        ready = await api.state(pid, "ready")
        assert ready["node_id"] == joined.node_id and ready["address"] == joined.config.address
        assert ready["rental_id"] == "r1" and ready["price_per_hour"] == 1.2 and ready["provider"] == "vastai"
        # the boot token was single-use: a second machine cannot join with it
        from anex_agent.wire import keys
        with pytest.raises(Exception) as err:
            await harness.client().join(request.env["ANEX_JOIN_TOKEN"], keys.KeyPair(keys.generate_private_key()),
                                        "intruder", "vastai")
        assert getattr(err.value, "status", None) == 401
        # running cost: price x time rented
        shift.advance(1800)
        view = await api.get(pid)
        assert view["cost_usd"] == pytest.approx(0.6, abs=0.01)
        async def scraped_after_ready() -> str | None:  # the scheduler refreshes the metrics snapshot
            async with aiohttp.ClientSession() as s:
                async with s.get(api.url + "/metrics", headers=api.headers) as r:
                    text = await r.text()
            return text if 'anex_provisions{state="ready"} 1' in text and pid in text else None
        text = await wait_until(scraped_after_ready, what="a metrics snapshot taken since the provision is ready")
        line = next(x for x in text.splitlines() if x.startswith("anex_provision_cost_usd{") and pid in x)
        assert float(line.split()[-1]) == pytest.approx(0.6, abs=0.01)
        from prometheus_client.parser import text_string_to_metric_families
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for family in text_string_to_metric_families(text) for s in family.samples}
        assert samples[("anex_provision_price_per_hour_usd", (("name", "train-1"), ("provision", pid)))] == 1.2
        assert samples[("anex_provisions", (("state", "ready"),))] == 1
        async with aiohttp.ClientSession() as s:  # the fleet side only: not without a token
            async with s.get(api.url + "/metrics") as r:
                assert "anex_provision" not in await r.text()
    finally:
        await stop_harness(harness)


async def test_idempotent_by_name_and_conflict_on_another_body(tmp_path, database_url, shift):
    harness = await start(tmp_path, database_url, shift, {"vastai": FakeRentals()}, FakeSelector([]))
    api = Api(harness)
    try:
        first = await api.call("POST", "/v1/provisions", SPEC)
        again = await api.call("POST", "/v1/provisions", SPEC)
        assert first[0] == 202 and again[0] == 200 and again[1]["id"] == first[1]["id"]
        status, problem = await api.call("POST", "/v1/provisions", {**SPEC, "image": "other:2"})
        assert status == 409 and problem["errors"][0]["field"] == "name"
        status, listed = await api.call("GET", "/v1/provisions")
        assert [p["id"] for p in listed["provisions"]] == [first[1]["id"]]
        # no candidate at all: failed, with the reason
        failed = await api.state(first[1]["id"], "failed")
        assert "no machine to rent" in failed["reason"]
        # a deleted name may be used again
        await api.call("DELETE", f"/v1/provisions/{first[1]['id']}")
        await api.state(first[1]["id"], "deleted")
        third = await api.call("POST", "/v1/provisions", SPEC)
        assert third[0] == 202 and third[1]["id"] != first[1]["id"]
    finally:
        await stop_harness(harness)


@pytest.mark.parametrize("env, field", [
    ({"GW_TUNNEL_5432": "db:notaport"}, "env.GW_TUNNEL_5432"),
    ({"GW_TUNNEL_99999": "db:5432"}, "env.GW_TUNNEL_99999"),
    ({"ANEX_JOIN_TOKEN": "x"}, "env.ANEX_JOIN_TOKEN"),
    ({"1BAD": "x"}, "env.1BAD"),
])
async def test_bad_env_is_422_naming_the_variable(tmp_path, shift, env, field):
    harness = await start(tmp_path, f"sqlite:///{tmp_path / 'c.db'}", shift, {"vastai": FakeRentals()},
                          FakeSelector([]))
    try:
        status, problem = await Api(harness).call("POST", "/v1/provisions", {**SPEC, "env": env})
        assert status == 422 and problem["errors"][0]["field"] == field
        status, problem = await Api(harness).call("POST", "/v1/provisions",
                                                  {**SPEC, "annotations": {"anex.sh/gpu-count": "many"}})
        assert status == 400 and problem["errors"][0]["field"] == "annotations.anex.sh/gpu-count"
        status, listed = await Api(harness).call("GET", "/v1/provisions")
        assert listed["provisions"] == []
    finally:
        await stop_harness(harness)


async def test_unavailable_after_renting_adopts_exactly_one_rental(tmp_path, database_url, shift):
    vast = FakeRentals()
    vast.faults["rent"] = ["rent-then-unavailable"]
    harness = await start(tmp_path, database_url, shift, {"vastai": vast}, FakeSelector(offers("o1", "o2")))
    api = Api(harness)
    try:
        pid = (await api.create())["id"]
        view = await api.state(pid, "booting")
        assert vast.rent_calls == ["o1"] and list(vast.rentals) == ["r1"]  # listed and adopted, not rented again
        assert view["rental_id"] == "r1" and len(view["attempts"]) == 1
    finally:
        await stop_harness(harness)


async def test_unavailable_before_renting_is_retried_on_the_same_offer(tmp_path, database_url, shift):
    vast = FakeRentals()
    vast.faults["rent"] = ["unavailable", "unavailable"]
    harness = await start(tmp_path, database_url, shift, {"vastai": vast}, FakeSelector(offers("o1", "o2")))
    api = Api(harness)
    try:
        pid = (await api.create())["id"]
        view = await api.state(pid, "booting")
        assert vast.rent_calls == ["o1", "o1", "o1"] and list(vast.rentals) == ["r1"]
        assert view["offer_id"] == "o1" and len(view["attempts"]) == 1
    finally:
        await stop_harness(harness)


async def test_boot_timeout_destroys_bans_and_tries_the_next(tmp_path, database_url, shift):
    vast = FakeRentals()
    harness = await start(tmp_path, database_url, shift, {"vastai": vast}, FakeSelector(offers("o1", "o2")))
    api = Api(harness)
    try:
        pid = (await api.create())["id"]
        _view, first = await _booting_request(api, vast, pid)
        # a node joined but never reported ready: it is removed with the rental
        _client, joined = await boot_node(harness, first, heartbeat=False)
        shift.advance(FAST.boot_timeout + 1)
        view = await api.until(pid, lambda v: v["state"] == "booting" and v["rental_id"] == "r2", "second rental")
        assert vast.destroyed == ["r1"] and list(vast.rentals) == ["r2"]
        assert view["attempts"][0]["outcome"] == "boot_timeout" and view["attempts"][0]["offer_id"] == "o1"
        assert "did not report ready" in view["attempts"][0]["reason"]
        nodes = await harness.admin.list_nodes()
        assert joined.node_id not in [n.id for n in nodes.nodes]
        banned = await BanStore(harness.ctx.db, clock=shift).banned_machines()
        assert "m-o1" in banned
        # the second one never joins either: no candidate left -> failed; nothing stays rented
        shift.advance(FAST.boot_timeout + 1)
        failed = await api.state(pid, "failed")
        assert vast.rentals == {} and vast.destroyed == ["r1", "r2"]
        assert [a["outcome"] for a in failed["attempts"]] == ["boot_timeout", "boot_timeout"]
    finally:
        await stop_harness(harness)


async def test_max_attempts_fails_with_the_last_reason(tmp_path, database_url, shift):
    vast = FakeRentals()
    vast.faults["rent"] = ["refuse"] * 10
    harness = await start(tmp_path, database_url, shift, {"vastai": vast},
                          FakeSelector(offers(*[f"o{i}" for i in range(10)])))
    api = Api(harness)
    try:
        pid = (await api.create())["id"]
        view = await api.state(pid, "failed")
        assert len(view["attempts"]) == FAST.max_attempts == len(vast.rent_calls)
        assert "gave up after 4 attempts" in view["reason"] and "no longer available" in view["reason"]
    finally:
        await stop_harness(harness)


async def test_delete_destroys_then_removes_node_idempotent(tmp_path, database_url, shift):
    vast = FakeRentals()
    harness = await start(tmp_path, database_url, shift, {"vastai": vast}, FakeSelector(offers("o1")))
    api = Api(harness)
    try:
        pid, joined = await _ready_provision(harness, api, vast)
        vast.faults["destroy"] = ["unavailable"]  # the provider is briefly away: retried
        status, body = await api.call("DELETE", f"/v1/provisions/{pid}")
        assert status == 202 and body["state"] == "deleting"
        status, body = await api.call("DELETE", f"/v1/provisions/{pid}")
        assert status == 202 and body["state"] in ("deleting", "deleted")
        view = await api.state(pid, "deleted")
        assert vast.rentals == {} and vast.destroyed == ["r1"]
        assert view["attempts"][0]["outcome"] == "deleted"
        assert joined.node_id not in [n.id for n in (await harness.admin.list_nodes()).nodes]
        status, body = await api.call("DELETE", f"/v1/provisions/{pid}")
        assert status == 202 and body["state"] == "deleted" and vast.destroyed == ["r1"]
        status, listed = await api.call("GET", "/v1/provisions")
        assert listed["provisions"] == []
        status, _ = await api.call("DELETE", "/v1/provisions/pv-nothing")
        assert status == 404
    finally:
        await stop_harness(harness)


async def test_reconciler_prunes_dangling_and_marks_vanished_lost(tmp_path, database_url, shift):
    vast = FakeRentals()
    harness = await start(tmp_path, database_url, shift, {"vastai": vast}, FakeSelector(offers("o1")))
    api = Api(harness)
    try:
        pid, joined = await _ready_provision(harness, api, vast)
        cluster = await store.cluster_id(harness.ctx.db)
        # a rental of ours that no provision owns, and one of another cluster (left alone)
        vast.rentals["stray"] = Rental("vastai", "stray", rental_label(cluster, "pv-gone"), "o9", 0.3)
        vast.rentals["theirs"] = Rental("vastai", "theirs", rental_label("c-other", "pv-x"), "o8", 0.3)
        loop = provisioner_of(harness.ctx)
        await loop.reconcile()
        assert "stray" in vast.destroyed and "theirs" in vast.rentals and "r1" in vast.rentals
        assert (await api.get(pid))["state"] == "ready"
        # the host takes the machine back: missing twice in a row -> lost, node revoked
        del vast.rentals["r1"]
        await loop.reconcile()
        assert (await api.get(pid))["state"] == "ready"
        await loop.reconcile()
        view = await api.get(pid)
        assert view["state"] == "lost" and "no longer lists rental r1" in view["reason"]
        assert view["attempts"][0]["outcome"] == "lost"
        assert joined.node_id not in [n.id for n in (await harness.admin.list_nodes()).nodes]
        assert cluster_label_prefix(cluster) == f"anex:{cluster}:"
    finally:
        await stop_harness(harness)


async def test_restart_adopts_the_rental_a_dead_coordinator_made(tmp_path, database_url, shift):
    """The first coordinator counted its rent call, the provider made the rental, and the coordinator
    died before it learned the id (simulated: its rent never returns). The next one adopts it."""
    vast = FakeRentals()
    hang = asyncio.Event()
    real_rent = vast.rent

    async def rent_and_die(request):
        await real_rent(request)
        await hang.wait()  # the answer never comes back

    vast.rent = rent_and_die  # type: ignore[method-assign]
    settings = FAST.__class__(**{**FAST.__dict__, "lease": 1.0})
    first = await start(tmp_path, database_url, shift, {"vastai": vast}, FakeSelector(offers("o1", "o2")), settings)
    api = Api(first)
    pid = (await api.create())["id"]
    await wait_until(lambda: vast.rentals, what="the first rent call")
    assert list(vast.rentals) == ["r1"]
    await stop_harness(first)  # the loop is cancelled mid-rent: its row says renting, one rent call made
    row = await _row(database_url, pid)
    assert row["state"] == "renting" and row["rent_tries"] == 1
    vast.rent = real_rent  # type: ignore[method-assign]
    second = await start(tmp_path, database_url, shift, {"vastai": vast}, FakeSelector(offers("o1", "o2")), settings)
    api = Api(second)
    try:
        view = await api.until(pid, lambda v: v["state"] == "booting", "adoption")
        assert view["rental_id"] == "r1" and vast.rent_calls == ["o1"] and list(vast.rentals) == ["r1"]
        await boot_node(second, vast.requests["r1"])
        await api.state(pid, "ready")
    finally:
        await stop_harness(second)


async def _row(database_url: str, pid: str) -> dict:
    from anex_agent.coordinator.db import open_database

    db = await open_database(database_url)
    try:
        return await store.get(db, pid)
    finally:
        await db.close()


async def test_watch_stream_tells_state_changes(tmp_path, database_url, shift):
    vast = FakeRentals()
    harness = await start(tmp_path, database_url, shift, {"vastai": vast}, FakeSelector(offers("o1")))
    api = Api(harness)
    try:
        async with aiohttp.ClientSession() as s:
            async with s.ws_connect(api.url + "/v1/provisions/watch", headers=api.headers) as ws:
                snapshot = json.loads((await ws.receive(timeout=GENEROUS)).data)
                assert snapshot["type"] == "snapshot" and snapshot["provisions"] == []
                pid = (await api.create())["id"]
                seen = []
                while "booting" not in seen:
                    event = json.loads((await ws.receive(timeout=GENEROUS)).data)
                    assert event["type"] == "changed" and event["provision"]["id"] == pid
                    seen.append(event["provision"]["state"])
                assert seen[0] == "selecting" or "renting" in seen
        status, _ = await Api(harness).call("GET", "/v1/provisions/watch")
        assert status == 400  # not a WebSocket upgrade
        async with aiohttp.ClientSession() as s:
            async with s.get(api.url + "/v1/provisions/watch") as r:
                assert r.status == 401
    finally:
        await stop_harness(harness)


async def test_openapi_documents_the_routes(tmp_path, shift):
    harness = await start(tmp_path, f"sqlite:///{tmp_path / 'c.db'}", shift, {}, FakeSelector([]))
    try:
        status, doc = await Api(harness).call("GET", "/v1/openapi.json")
        assert {"/v1/provisions", "/v1/provisions/{provision_id}", "/v1/provisions/watch"} <= set(doc["paths"])
        post = doc["paths"]["/v1/provisions"]["post"]
        assert {"202", "409", "422"} <= set(post["responses"])
    finally:
        await stop_harness(harness)


async def test_delete_while_the_rent_call_is_in_flight_destroys_what_it_rented(tmp_path, database_url, shift):
    vast = FakeRentals()
    release = asyncio.Event()
    real_rent = vast.rent

    async def slow_rent(request):
        await release.wait()
        return await real_rent(request)

    vast.rent = slow_rent  # type: ignore[method-assign]
    harness = await start(tmp_path, database_url, shift, {"vastai": vast}, FakeSelector(offers("o1")))
    api = Api(harness)
    try:
        pid = (await api.create())["id"]
        await api.state(pid, "renting")
        status, body = await api.call("DELETE", f"/v1/provisions/{pid}")
        assert status == 202 and body["state"] == "deleting"
        release.set()  # the provider answers after the DELETE: the machine it rented is destroyed
        view = await api.state(pid, "deleted")
        assert vast.rent_calls == ["o1"] and vast.destroyed == ["r1"] and vast.rentals == {}
        assert view["attempts"][0]["rental_id"] == "r1" and view["attempts"][0]["outcome"] == "deleted"
    finally:
        await stop_harness(harness)


async def test_one_coordinator_at_a_time_drives_a_provision(database_url, tmp_path):
    from anex_agent.coordinator import migrations
    from anex_agent.coordinator.db import open_database
    from anex_agent.wire import provisioning as models

    db = await open_database(database_url)
    try:
        await migrations.apply(db, [*migrations.CORE, *store.MIGRATIONS])
        row, _ = await store.create(db, models.ProvisionCreate(name="x", image="i"), now=100.0)
        assert await store.claim(db, row["id"], "a", now=100.0, lease=30)
        assert not await store.claim(db, row["id"], "b", now=110.0, lease=30)  # a holds it
        assert await store.claim(db, row["id"], "a", now=120.0, lease=30)  # a renews
        assert await store.claim(db, row["id"], "b", now=151.0, lease=30)  # a's lease lapsed (a died)
        await store.release(db, row["id"], "a")  # not a's any more: nothing changes
        assert not await store.claim(db, row["id"], "a", now=152.0, lease=30)
        await store.release(db, row["id"], "b")
        assert await store.claim(db, row["id"], "a", now=153.0, lease=30)
    finally:
        await db.close()


async def test_a_delete_and_a_step_on_one_provision_never_lose_a_write(database_url):
    """A step moves a provision only from the state it read (renting -> booting), a DELETE
    moves it to deleting whatever it read: with the row read for update, the DELETE's read
    waits for the step's transaction and sees its write, and the step, had the DELETE come
    first, would see deleting and leave it. (PostgreSQL runs READ COMMITTED: with a plain
    read, a DELETE committed between the step's read and write was overwritten.)"""
    from anex_agent.coordinator import migrations
    from anex_agent.coordinator.db import open_database
    from tests.coordinator.lock_waits import another_waits
    from anex_agent.wire import provisioning as models

    db = await open_database(database_url)
    try:
        await migrations.apply(db, [*migrations.CORE, *store.MIGRATIONS])
        row, _ = await store.create(db, models.ProvisionCreate(name="x", image="i"), now=100.0)
        pid = row["id"]
        await db.execute("UPDATE provisions SET state = $2 WHERE id = $1", pid, "renting")
        seen_by_delete: list[str] = []

        async def delete() -> None:  # the DELETE route's transaction
            async with db.transaction() as tx:
                seen_by_delete.append((await store.get_for_update(tx, pid))["state"])
                await store.set_state(db, tx, pid, models.ProvisionState.deleting, now=101.0)

        async def delete_waits_or_read() -> bool:
            return bool(seen_by_delete) or await another_waits(db)

        async with db.transaction() as tx:  # the step's compare-and-set
            assert await store.state_for_update(tx, pid) == "renting"
            deleting = asyncio.create_task(delete())
            await wait_until(delete_waits_or_read, what="the DELETE to wait for the step (or read past it)")
            await store.set_state(db, tx, pid, models.ProvisionState.booting, now=100.5)
        await deleting
        assert seen_by_delete == ["booting"]
        assert (await store.get(db, pid))["state"] == "deleting"
        async with db.transaction() as tx:  # the next step sees the DELETE and moves nothing
            assert await store.state_for_update(tx, pid) == "deleting"
    finally:
        await db.close()


async def test_a_provider_unavailable_for_every_try_moves_to_the_next_candidate(tmp_path, shift):
    vast = FakeRentals()
    vast.faults["rent"] = ["unavailable"] * FAST.rent_tries
    runpod = FakeRentals(name="runpod")
    harness = await start(tmp_path, f"sqlite:///{tmp_path / 'c.db'}", shift, {"vastai": vast, "runpod": runpod},
                          FakeSelector([*offers("o1"), *offers("p1", provider="runpod")]))
    api = Api(harness)
    try:
        pid = (await api.create())["id"]
        view = await api.state(pid, "booting")
        assert vast.rent_calls == ["o1"] * FAST.rent_tries and vast.rentals == {}
        assert view["attempts"][0]["outcome"] == "unavailable" and "did not answer 4 rent calls" in \
            view["attempts"][0]["reason"]
        assert view["provider"] == "runpod" and list(runpod.rentals) == ["r1"]
    finally:
        await stop_harness(harness)


async def test_a_refused_api_key_fails_the_provision_with_the_reason(tmp_path, shift):
    vast = FakeRentals()
    vast.faults["rent"] = ["key-refused"]
    harness = await start(tmp_path, f"sqlite:///{tmp_path / 'c.db'}", shift, {"vastai": vast},
                          FakeSelector(offers("o1", "o2")))
    api = Api(harness)
    try:
        pid = (await api.create())["id"]
        view = await api.state(pid, "failed")
        assert "vastai refused the API key" in view["reason"] and "check the provider key" in view["reason"]
        assert vast.rent_calls == ["o1"]  # not retried, no other offer tried: no key works for any
        assert [a["outcome"] for a in view["attempts"]] == ["failed"]
        await scheduler_passes(harness, 3)  # its chances to try again
        assert vast.rent_calls == ["o1"] and (await api.get(pid))["state"] == "failed"
    finally:
        await stop_harness(harness)


async def test_no_capacity_lists_then_moves_to_the_next_candidate(tmp_path, shift):
    vast = FakeRentals(name="runpod")
    vast.faults["rent"] = ["no-capacity"]
    harness = await start(tmp_path, f"sqlite:///{tmp_path / 'c.db'}", shift, {"runpod": vast},
                          FakeSelector(offers("p1", "p2", provider="runpod")))
    api = Api(harness)
    try:
        pid = (await api.create())["id"]
        view = await api.state(pid, "booting")
        assert vast.rent_calls == ["p1", "p2"] and list(vast.rentals) == ["r1"]
        assert view["attempts"][0]["outcome"] == "refused" and "no longer any instances" in \
            view["attempts"][0]["reason"]
    finally:
        await stop_harness(harness)


@pytest.mark.parametrize("how", ["deleted", "expired"])
async def test_a_ready_provision_whose_node_goes_is_lost_and_its_rental_destroyed(tmp_path, shift, how):
    vast = FakeRentals()
    harness = await start(tmp_path, f"sqlite:///{tmp_path / 'c.db'}", shift, {"vastai": vast},
                          FakeSelector(offers("o1")))
    api = Api(harness)
    try:
        pid, joined = await _ready_provision(harness, api, vast)
        if how == "deleted":
            await harness.admin.delete_node(joined.node_id)
            shift.advance(2)  # the ready nodes' look (every 2 s) is due at the scheduler's next pass
        else:
            shift.advance(harness.ctx.settings.timings.expired_after + 1)
        view = await api.state(pid, "lost")
        assert f"its node {joined.node_id} " in view["reason"] and how in view["reason"]
        assert view["attempts"][0]["outcome"] == "lost"
        # destroyed right after the state change
        await wait_until(lambda: not vast.rentals, what="the lost provision's rental destroyed")
        assert vast.rentals == {} and vast.destroyed == ["r1"]
        assert joined.node_id not in [n.id for n in (await harness.admin.list_nodes()).nodes]
    finally:
        await stop_harness(harness)


@pytest.fixture
def agent_file(tmp_path):
    path = tmp_path / "anex-agent-x86_64"
    path.write_bytes(b"#!/bin/sh\necho agent\n")
    return path


async def test_download_start_script_by_default_when_the_coordinator_serves_the_agent(tmp_path, shift, agent_file):
    import hashlib

    vast = FakeRentals()
    harness = await start(tmp_path, f"sqlite:///{tmp_path / 'c.db'}", shift, {"vastai": vast},
                          FakeSelector(offers("o1")), agent_binaries=(("x86_64", agent_file),))
    api = Api(harness)
    try:
        created = await api.create()
        assert created["agent"] == "download"
        assert (await api.create())["id"] == created["id"]  # the same body again: the same provision
        _view, request = await _booting_request(api, vast, created["id"])
        script = request.onstart
        assert script and f"x86_64) sha256={hashlib.sha256(agent_file.read_bytes()).hexdigest()}" in script
        assert "http://coordinator.test" in script and "exec \"$agent\" run -- python train.py" in script
        # the token is in the script only, not in the rental's environment
        assert not any(k.startswith("ANEX_") for k in request.env) and "anexjt_" in script
        assert request.env["GW_TUNNEL_5432"] == "db.default.svc.cluster.local:5432"
        # the token is the provision's: the agent downloads with it, then joins with it
        secret = next(w.strip("'") for w in script.split() if w.strip("'").startswith("anexjt_"))
        async with aiohttp.ClientSession() as s:
            async with s.get(api.url + "/v1/agent/x86_64", headers={"Authorization": f"Bearer {secret}"}) as r:
                assert r.status == 200 and await r.read() == agent_file.read_bytes()
        env = {"ANEX_JOIN_TOKEN": secret, "ANEX_NODE_NAME": "train-1", "ANEX_PROVIDER": "vastai"}
        await boot_node(harness, type(request)(**{**request.__dict__, "env": env}))
        await api.state(created["id"], "ready")
        # entrypoint still asked for explicitly: the token in the environment, no script
        spec = {**SPEC, "name": "train-2", "agent": "entrypoint"}
        other = await api.create(spec)
        _view, request = await _booting_request(api, vast, other["id"])
        assert request.onstart is None and request.env["ANEX_JOIN_TOKEN"].startswith("anexjt_")
    finally:
        await stop_harness(harness)


async def test_download_without_an_agent_file_or_a_command_is_a_422(tmp_path, shift):
    harness = await start(tmp_path, f"sqlite:///{tmp_path / 'c.db'}", shift, {"vastai": FakeRentals()},
                          FakeSelector(offers("o1")))
    api = Api(harness)
    try:
        created = await api.create()
        assert created["agent"] == "entrypoint"  # the default without an agent file to serve
        status, body = await api.call("POST", "/v1/provisions", {**SPEC, "name": "dl", "agent": "download"})
        assert status == 422 and body["errors"][0]["field"] == "agent" and "--agent-binary" in body["errors"][0]["message"]
        status, body = await api.call("POST", "/v1/provisions", {**SPEC, "name": "dl", "agent": "docker"})
        assert status == 422 and body["errors"][0]["field"] == "agent"
    finally:
        await stop_harness(harness)
    harness = await start(tmp_path, f"sqlite:///{tmp_path / 'c.db'}", shift, {"vastai": FakeRentals()},
                          FakeSelector(offers("o1")), agent_binaries=(("x86_64", tmp_path / "c.db"),))
    api = Api(harness)
    try:
        status, body = await api.call("POST", "/v1/provisions", {**{k: v for k, v in SPEC.items()
                                                                     if k not in ("command", "args")}, "name": "dl2"})
        assert status == 422 and body["errors"][0]["field"] == "command"
    finally:
        await stop_harness(harness)


async def test_download_fails_the_provision_when_the_agent_file_is_gone(tmp_path, shift, agent_file):
    vast = FakeRentals()
    harness = await start(tmp_path, f"sqlite:///{tmp_path / 'c.db'}", shift, {"vastai": vast},
                          FakeSelector(offers("o1")), agent_binaries=(("x86_64", agent_file),))
    api = Api(harness)
    try:
        agent_file.unlink()  # configured at start, gone since
        view = await api.state((await api.create())["id"], "failed")
        assert "agent file cannot be read" in view["reason"] and str(agent_file) in view["reason"]
        assert vast.rent_calls == [] and view["attempts"][0]["outcome"] == "failed"
    finally:
        await stop_harness(harness)


@pytest.mark.parametrize("login, field", [
    ({"username": "acme", "password": "pw -u x"}, "registry_auth.password"),
    ({"username": "-x", "password": "pw"}, "registry_auth.username"),
    ({"username": "ac\tme", "password": "pw"}, "registry_auth.username"),
    ({"server": "-h.io", "username": "acme", "password": "pw"}, "registry_auth.server"),
])
async def test_a_registry_login_that_would_split_docker_logins_arguments_is_422_naming_the_field(
        tmp_path, shift, login, field):
    vast = FakeRentals()
    harness = await start(tmp_path, f"sqlite:///{tmp_path / 'c.db'}", shift, {"vastai": vast}, FakeSelector([]))
    try:
        status, problem = await Api(harness).call("POST", "/v1/provisions",
                                                  {**SPEC, "registry_auth": {"server": "ghcr.io", **login}})
        assert status == 422 and problem["errors"][0]["field"] == field
        assert "spaces" in problem["errors"][0]["message"] or "'-'" in problem["errors"][0]["message"]
        assert vast.rent_calls == []
    finally:
        await stop_harness(harness)


async def test_a_registry_login_is_stored_sealed_reaches_the_rent_and_is_never_answered(tmp_path, database_url,
                                                                                          shift):
    from anex_agent.coordinator.provisioning import registry_auth

    vast = FakeRentals()
    harness = await start(tmp_path, database_url, shift, {"vastai": vast}, FakeSelector(offers("o1")))
    api = Api(harness)
    password = "pull-pa55-word-7c1"
    spec = {**SPEC, "registry_auth": {"server": "ghcr.io", "username": "acme", "password": password}}
    try:
        status, created = await api.call("POST", "/v1/provisions", spec)
        assert status == 202 and password not in json.dumps(created)
        assert (await api.call("POST", "/v1/provisions", spec))[0] == 200  # the same body: idempotent
        other = {**spec, "registry_auth": {**spec["registry_auth"], "password": "another"}}
        assert (await api.call("POST", "/v1/provisions", other))[0] == 409
        _view, request = await _booting_request(api, vast, created["id"])
        login = request.registry_login
        assert (login.server, login.username, login.password) == ("ghcr.io", "acme", password)
        row = await store.get(harness.ctx.db, created["id"])
        assert password not in row["spec"] and password not in row["spec_hash"]
        assert row["registry_auth"].startswith("v1:") and password not in row["registry_auth"]
        assert registry_auth.unseal(harness.ctx.signing_key, row["registry_auth"], "train-1").password == password
        with pytest.raises(registry_auth.SealError):  # bound to its provision's name
            registry_auth.unseal(harness.ctx.signing_key, row["registry_auth"], "train-2")
        with pytest.raises(registry_auth.SealError):  # and to this coordinator's key
            registry_auth.unseal(b"\x01" * 32, row["registry_auth"], "train-1")
        assert password not in json.dumps((await api.call("GET", f"/v1/provisions/{created['id']}"))[1])
    finally:
        await stop_harness(harness)
