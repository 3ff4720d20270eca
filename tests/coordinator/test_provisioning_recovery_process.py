"""Recovery end to end: a real coordinator process renting from the fake Vast.AI and RunPod
servers through the real clients, each failure kind replaced under the recovery policy, and the
time from the failure to the replacement attempt's rental measured (printed: run with ``-s``).

Failure kinds: a machine that never runs at its provider, one that runs but whose agent never
joins, an interruptible machine outbid/preempted (the provider lists it stopped), a GPU that
reports XID 79, a machine the host takes back (no longer listed). The interruptible rent carries
the bid (Vast.AI ``price``) or ``"interruptible": true`` (RunPod). The running deadline, the
backoff and the reconciliation are shortened through the coordinator's environment (whole
seconds), the join deadline through the annotation of the one provision nobody joins: the
test's own joins never race a deadline.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime

from anex_agent.wire import keys
from anex_agent.wire.heartbeat import Heartbeat
from anex_agent.client.rest import CoordinatorClient
from anex_agent.testing.fake_providers import vast_bundle
from anex_agent.telemetry.models import Telemetry
from tests.coordinator.test_provisioning_process import SPEC, Coordinator, _call, _until, provider  # noqa: F401

DEADLINE = 2  # seconds: the running phase (every provision), the join phase (the one whose agents never join)
BACKOFF = 1  # seconds: retries wait 0.5-1 s
ENV = {"ANEX_PROVISION_DEADLINE_RUNNING": str(DEADLINE),
       "ANEX_PROVISION_RETRY_ON": "error,interruption", "ANEX_PROVISION_RETRY_BACKOFF": str(BACKOFF),
       "ANEX_PROVISION_RETRY_BACKOFF_MAX": str(BACKOFF), "ANEX_PROVISION_RECONCILE_INTERVAL": "1",
       "ANEX_PROVISION_MAX_ATTEMPTS": "20"}


def _t(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


async def _join(url: str, env: dict) -> tuple[str, object]:
    async with CoordinatorClient(url) as client:
        joined = await client.join(env["ANEX_JOIN_TOKEN"], keys.KeyPair(keys.generate_private_key()),
                                   env["ANEX_NODE_NAME"], env["ANEX_PROVIDER"])
        client.set_credential(joined.credential)
        await client.heartbeat(joined.node_id, Heartbeat())
        return joined.node_id, joined.credential


async def _xid(url: str, node_id: str, credential) -> None:
    async with CoordinatorClient(url) as client:
        client.set_credential(credential)
        telemetry = Telemetry.model_validate({"v": 1, "gpus": [{"index": 0, "last_xid": 79, "xid_counts": {"79": 1}}]})
        await client.heartbeat(node_id, Heartbeat(telemetry=telemetry))


def test_each_failure_kind_is_replaced_and_timed(tmp_path, provider):  # noqa: F811
    if provider.kind == "vastai":  # failed machines are banned: enough offers for every kind
        for n in range(4004, 4010):
            bundle = vast_bundle(n, price=0.5 + (n - 4000) / 100)
            provider.fake.bundles.append(bundle)
            provider.fake.offers.add(str(n))
            provider.fake.prices[str(n)] = bundle["dph_total"]
            provider.fake.machines[str(n)] = bundle["machine_id"]
    coord = Coordinator(tmp_path, f"sqlite:///{tmp_path / 'c.db'}", provider, **ENV)
    figures: dict[str, float] = {}
    try:
        coord.start()
        # machines nobody joins: a provision with a short join deadline (the others keep the default, so
        # the test's own joins never race it)
        spec = {**SPEC, "name": "silent", "annotations": {"anex.sh/interruptible": "true",
                                                          "anex.sh/deadline-join": f"{DEADLINE}s"}}

        def replaced(pid: str, n: int) -> dict:
            return _until(lambda: (v := coord.view(pid)) and len(v["attempts"]) > n and v["attempts"][n]["rented_at"]
                          and v, f"attempt {n + 1} rented", 30)

        # a machine that never runs at its provider
        provider.fake.boot_status = "loading"
        pid = coord.create(spec)
        coord.state(pid, "booting")
        provider.fake.boot_status = "running"  # the next machine runs (but its agent never joins)
        view = replaced(pid, 1)
        first = view["attempts"][0]
        assert first["outcome"] == "deadline" and first["reason"].startswith("phase running:")
        figures["never running"] = _t(view["attempts"][1]["rented_at"]) - (_t(first["rented_at"]) + DEADLINE)
        # the interruptible rental carried its bid / spot flag
        rentals = list(provider.rentals.values())
        assert len(rentals) == 1 and rentals[0].interruptible
        if provider.kind == "vastai":
            price = view["attempts"][1]["price_per_hour"]  # the offer's price the selection chose
            assert rentals[0].bid == price and rentals[0].body["price"] == price
        else:
            assert rentals[0].body["interruptible"] is True
        # runs, but its agent never joins
        view = replaced(pid, 2)
        second = view["attempts"][1]
        assert second["outcome"] == "deadline" and second["reason"].startswith("phase join:"), second
        figures["never joins"] = _t(view["attempts"][2]["rented_at"]) - (_t(second["running_at"]) + DEADLINE)
        assert len(provider.rentals) == 1
        status, _ = _call(coord.url, "DELETE", f"/v1/provisions/{pid}")
        assert status == 202
        coord.state(pid, "deleted")

        # outbid / preempted once ready
        pid = coord.create({**SPEC, "name": "job-2", "annotations": {"anex.sh/interruptible": "true"}})
        coord.state(pid, "booting")
        (rental,) = provider.rentals.values()
        asyncio.run(_join(coord.url, rental.env))
        coord.state(pid, "ready")
        provider.fake.interrupt(rental.rental_id)
        at = time.time()
        view = replaced(pid, 1)
        assert (view["attempts"][0]["outcome"], view["attempts"][0]["event"]) == ("interrupted", "interruption")
        figures["outbid / preempted"] = _t(view["attempts"][1]["rented_at"]) - at
        assert rental.rental_id in provider.fake.destroyed and len(provider.rentals) == 1

        # a GPU falls off the bus (XID 79)
        (rental,) = provider.rentals.values()
        node_id, credential = asyncio.run(_join(coord.url, rental.env))
        coord.state(pid, "ready")
        asyncio.run(_xid(coord.url, node_id, credential))
        at = time.time()
        view = replaced(pid, 2)
        assert view["attempts"][1]["outcome"] == "unhealthy" and "XID 79" in view["attempts"][1]["reason"]
        figures["GPU XID 79"] = _t(view["attempts"][2]["rented_at"]) - at
        if provider.kind == "vastai":
            _status, bans = _call(coord.url, "GET", "/v1/bans")
            assert view["attempts"][1]["machine_id"] in [b["machine_id"] for b in bans["bans"]]

        # the host takes the machine back
        (rental,) = provider.rentals.values()
        asyncio.run(_join(coord.url, rental.env))
        coord.state(pid, "ready")
        provider.fake.vanish(rental.rental_id)
        at = time.time()
        view = replaced(pid, 3)
        assert view["attempts"][2]["outcome"] == "lost" and view["attempts"][2]["event"] == "interruption"
        figures["taken back (vanished)"] = _t(view["attempts"][3]["rented_at"]) - at
        assert len(provider.rentals) == 1
    finally:
        coord.stop()
    print(f"\ntime to replacement on the fake {provider.kind} (deadlines {DEADLINE} s, backoff {BACKOFF} s, "
          "reconcile 1 s):")
    for kind, seconds in figures.items():
        print(f"  {kind:24s} {seconds:6.2f} s")
