"""Provisioning end to end: a real coordinator process (``python -m anex_agent coordinator``)
renting from the fake Vast.AI and RunPod servers (anex_agent/testing/fake_providers.py) through
the real rental clients and the live selection, SQLite and PostgreSQL. The test plays the agent
of each rented machine (join with the boot token it was given, heartbeat).

* a 400 on the first candidate, then a 429 and a 503 on the next rent calls: the second
  candidate is rented exactly once; a 429 and a 503 on destroy: DELETE still ends with nothing
  rented and no node;
* a lost answer (created, then 500): exactly one rental, adopted;
* a refused API key (401): the provision fails saying so, nothing is retried;
* no capacity (a 500 saying so): the next candidate, after listing found nothing;
* a machine that never joins: destroyed, its machine banned (Vast.AI), the next candidate tried;
* the coordinator SIGKILLed while its rent call is in flight, restarted on the same database:
  exactly one rental exists and the provision finishes;
* a dangling labelled rental is destroyed; a rental that vanishes makes the provision lost and
  its node revoked;
* with ``--agent-binary`` the rental gets the start script (the agent's hash, the provision's
  token, which downloads the agent and joins).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.error
import urllib.request

import pytest

from anex_agent.wire import keys
from anex_agent.wire.heartbeat import Heartbeat
from anex_agent.client.rest import CoordinatorClient
from anex_agent.testing.fake_providers import (
    FakeRental, FakeRunPod, FakeVastAI, ThreadedFake, runpod_gpu_type, vast_bundle,
)
from tests.coordinator.conftest import BACKENDS, backend_url
from tests.coordinator.coordinator_process import CoordinatorProcess

ADMIN = "anexadm_test_admin_token_for_provisioning"
KEY = "provider-api-key-0123456789"
SPEC = {"name": "job-1", "image": "anex/agent:latest", "command": ["sleep", "infinity"]}
PROVIDERS = ["vastai", "runpod"]


def _call(url: str, method: str, path: str, body=None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method=method,
                                 headers={"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def _until(predicate, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class Provider:
    """A fake provider on its own thread, and the coordinator environment that rents from it."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        if kind == "vastai":
            self.fake = FakeVastAI(api_key=KEY, bundles=[vast_bundle(4001, price=0.3), vast_bundle(4002, price=0.4),
                                                         vast_bundle(4003, price=0.5)])
        else:  # one GPU type in three data centers, two tiers each
            self.fake = FakeRunPod(api_key=KEY, gpu_types=[runpod_gpu_type(price=0.4)],
                                   datacenters=("EU-RO-1", "EU-SE-1", "US-TX-3"))
        self.served = ThreadedFake(self.fake)

    def start(self) -> None:
        self.served.start()

    def stop(self) -> None:
        self.served.stop()

    def env(self) -> dict[str, str]:
        if self.kind == "vastai":
            return {"ANEX_VASTAI_URL": self.fake.url, "ANEX_VASTAI_API_KEY": KEY}
        return {"ANEX_RUNPOD_URL": self.fake.graphql_url, "ANEX_RUNPOD_REST_URL": self.fake.url,
                "ANEX_RUNPOD_API_KEY": KEY}

    @property
    def rentals(self) -> dict[str, FakeRental]:
        return self.fake.rentals

    def rent_calls(self) -> int:
        path = "/api/v0/asks/" if self.kind == "vastai" else "/v1/pods"
        return sum(1 for method, p in self.fake.calls if method in ("PUT", "POST") and p.startswith(path))

    def destroy_calls(self) -> int:
        return sum(1 for method, _p in self.fake.calls if method == "DELETE")


class Coordinator:
    def __init__(self, tmp_path, database: str, provider: Provider, **env: str) -> None:
        self.args = ["--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "state"), "--database", database,
                     "--heartbeat-flush-interval", "0"]
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith("ANEX_")},
                    "ANEX_ADMIN_TOKEN": ADMIN, **provider.env(),
                    "ANEX_PROVISION_COORDINATOR_URL": "http://coordinator.invalid:8700",
                    "ANEX_PROVISION_LEASE": "2", "ANEX_PROVISION_BOOT_TIMEOUT": "120",
                    "ANEX_PROVISION_BACKOFF": "0.2", "ANEX_PROVISION_POLL_INTERVAL": "0.1",
                    "ANEX_SELECTION_ATTEMPTS": "3", **env}
        self.proc: CoordinatorProcess | None = None
        self.url = ""

    def start(self) -> str:
        self.proc = CoordinatorProcess(self.args, env=self.env)
        self.url = self.proc.wait_listening()
        return self.url

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.popen.send_signal(signal.SIGKILL)
        self.proc.popen.wait(10)

    def stop(self) -> str:
        return self.proc.stop() if self.proc is not None else ""

    def create(self, spec: dict = SPEC) -> str:
        status, created = _call(self.url, "POST", "/v1/provisions", spec)
        assert status == 202, created
        return created["id"]

    def view(self, pid: str) -> dict:
        status, body = _call(self.url, "GET", f"/v1/provisions/{pid}")
        assert status == 200, body
        return body

    def state(self, pid: str, state: str, timeout: float = 30.0) -> dict:
        last: dict = {}

        def reached():
            last.update(self.view(pid))
            if last["state"] == "failed" and state != "failed":
                raise AssertionError(f"provision failed: {last['reason']}")
            return last["state"] == state and dict(last)

        try:
            return _until(reached, f"state {state}", timeout)
        except AssertionError as err:
            raise AssertionError(f"{err}; last view: {last}") from None

    def nodes(self) -> list[dict]:
        status, body = _call(self.url, "GET", "/v1/nodes")
        assert status == 200, body
        return body["nodes"]


async def _agent(url: str, env: dict) -> str:
    """What the agent on the rented machine does with its boot env: join, heartbeat."""
    async with CoordinatorClient(url) as client:
        joined = await client.join(env["ANEX_JOIN_TOKEN"], keys.KeyPair(keys.generate_private_key()),
                                   env["ANEX_NODE_NAME"], env["ANEX_PROVIDER"])
        client.set_credential(joined.credential)
        await client.heartbeat(joined.node_id, Heartbeat())
        return joined.node_id


def _boot(coord: Coordinator, rental: FakeRental) -> str:
    return asyncio.run(_agent(coord.url, rental.env))


@pytest.fixture(params=PROVIDERS)
def provider(request):
    served = Provider(request.param)
    served.start()
    yield served
    served.stop()


@pytest.mark.parametrize("backend", BACKENDS)
def test_sigkill_mid_rent_then_restart_finishes_with_exactly_one_rental(tmp_path, provider, backend):
    hang = asyncio.Event()  # of the fake's loop: set there

    async def rent_and_hang(_rental: FakeRental) -> None:
        await hang.wait()  # the rental exists; its answer never comes

    async def _run() -> None:
        async with backend_url(backend, tmp_path) as database:
            await asyncio.to_thread(_scenario, database)

    def _scenario(database: str) -> None:
        coord = Coordinator(tmp_path, database, provider)
        provider.fake.on_rent = rent_and_hang
        try:
            coord.start()
            pid = coord.create()
            _until(lambda: provider.rentals, "the rental")
            coord.kill()  # mid-provision: its rent call is in flight, it never learned the rental's id
            provider.fake.on_rent = None
            provider.served.loop.call_soon_threadsafe(hang.set)
            assert len(provider.rentals) == 1
            coord.start()
            view = coord.state(pid, "booting")
            (rental,) = provider.rentals.values()
            assert view["rental_id"] == rental.rental_id and provider.rent_calls() == 1
            node_id = _boot(coord, rental)
            ready = coord.state(pid, "ready")
            assert ready["node_id"] == node_id and len(provider.rentals) == 1
            assert ready["price_per_hour"] == pytest.approx(rental.price_per_hour)
            status, _ = _call(coord.url, "DELETE", f"/v1/provisions/{pid}")
            assert status == 202
            coord.state(pid, "deleted")
            assert provider.rentals == {} and provider.fake.destroyed == [rental.rental_id]
            assert coord.nodes() == []
        finally:
            stderr = coord.stop()
        assert "anexjt_" not in stderr and KEY not in stderr  # neither boot token nor API key is logged

    asyncio.run(_run())


def test_refusals_and_provider_errors_never_rent_twice(tmp_path, provider):
    coord = Coordinator(tmp_path, f"sqlite:///{tmp_path / 'c.db'}", provider)
    fake = provider.fake
    fake.fail("rent", 400)  # the first candidate is refused
    fake.fail("rent", 429, retry_after=0)  # the second: the provider is busy, then away
    fake.fail("rent", 503)
    try:
        coord.start()
        pid = coord.create()
        view = coord.state(pid, "booting")
        assert provider.rent_calls() == 4 and len(provider.rentals) == 1
        assert [a["outcome"] for a in view["attempts"]] == ["refused", None]
        assert "HTTP 400" in view["attempts"][0]["reason"]
        assert view["attempts"][0]["offer_id"] != view["attempts"][1]["offer_id"]
        (rental,) = provider.rentals.values()
        node_id = _boot(coord, rental)
        assert coord.state(pid, "ready")["node_id"] == node_id
        # destroy answered 429, then 503: retried until the provider confirms
        fake.fail("destroy", 429, retry_after=0)
        fake.fail("destroy", 503)
        deletes = provider.destroy_calls()
        _call(coord.url, "DELETE", f"/v1/provisions/{pid}")
        coord.state(pid, "deleted")
        assert provider.rentals == {} and provider.destroy_calls() - deletes >= 3
        assert coord.nodes() == []

        # a lost answer: the rental is made, the answer is a 500; listing adopts it, no second rent
        fake.lose_answer()
        calls = provider.rent_calls()
        pid = coord.create({**SPEC, "name": "job-2"})
        view = coord.state(pid, "booting")
        assert provider.rent_calls() - calls == 1 and len(provider.rentals) == 1
        (rental,) = provider.rentals.values()
        assert view["rental_id"] == rental.rental_id and len(view["attempts"]) == 1
        _call(coord.url, "DELETE", f"/v1/provisions/{pid}")
        coord.state(pid, "deleted")

        # no capacity (a 500 saying so): listing finds nothing, the next candidate is rented
        fake.no_capacity()
        calls = provider.rent_calls()
        pid = coord.create({**SPEC, "name": "job-3"})
        view = coord.state(pid, "booting")
        assert provider.rent_calls() - calls == 2 and len(provider.rentals) == 1
        assert view["attempts"][0]["outcome"] == "refused" and "no longer any instances" in \
            view["attempts"][0]["reason"]
        _call(coord.url, "DELETE", f"/v1/provisions/{pid}")
        coord.state(pid, "deleted")

        # the API key is refused: failed, with the reason, and nothing tried again
        fake.fail("rent", 401, times=10)
        calls = provider.rent_calls()
        pid = coord.create({**SPEC, "name": "job-4"})
        failed = coord.state(pid, "failed")
        assert "refused the API key" in failed["reason"] and provider.rent_calls() - calls == 1
        time.sleep(1)
        assert provider.rent_calls() - calls == 1 and provider.rentals == {}
    finally:
        stderr = coord.stop()
    assert KEY not in stderr


def test_a_machine_that_never_joins_is_destroyed_banned_and_the_next_tried(tmp_path, provider):
    coord = Coordinator(tmp_path, f"sqlite:///{tmp_path / 'c.db'}", provider, ANEX_PROVISION_BOOT_TIMEOUT="10")
    try:
        coord.start()
        pid = coord.create()
        first = coord.state(pid, "booting")
        (silent,) = provider.rentals.values()
        second = _until(lambda: (v := coord.view(pid))["state"] == "booting" and v["rental_id"] != first["rental_id"]
                        and v, "the next candidate rented", 40)
        assert silent.rental_id in provider.fake.destroyed and list(provider.rentals) == [second["rental_id"]]
        assert second["attempts"][0]["outcome"] == "boot_timeout" and "no node joined" in \
            second["attempts"][0]["reason"]
        assert second["attempts"][1]["offer_id"] != second["attempts"][0]["offer_id"]
        status, bans = _call(coord.url, "GET", "/v1/bans")
        banned = [b["machine_id"] for b in bans["bans"]]
        if provider.kind == "vastai":  # Vast.AI machines are banned; RunPod has no machine id to ban
            assert banned == [second["attempts"][0]["machine_id"]]
        else:
            assert banned == []
        (rental,) = provider.rentals.values()
        _boot(coord, rental)
        coord.state(pid, "ready")
    finally:
        coord.stop()


def test_dangling_rental_pruned_and_vanished_rental_lost(tmp_path, provider):
    coord = Coordinator(tmp_path, f"sqlite:///{tmp_path / 'c.db'}", provider, ANEX_PROVISION_RECONCILE_INTERVAL="1")
    try:
        coord.start()
        pid = coord.create()
        coord.state(pid, "booting")
        (rental,) = provider.rentals.values()
        # a rental carrying our cluster's label but no live provision's id is destroyed
        cluster_prefix = rental.label.rsplit(":", 1)[0] + ":"
        stray = FakeRental("777", rental.offer_id, cluster_prefix + "pv-gone", rental.image, {}, None, [], 0.4, {})
        provider.rentals["777"] = stray
        theirs = FakeRental("778", rental.offer_id, "anex:c-another-cluster:pv-1", rental.image, {}, None, [], 0.4, {})
        provider.rentals["778"] = theirs
        _until(lambda: "777" in provider.fake.destroyed, "the dangling rental destroyed", 15)
        node_id = _boot(coord, rental)
        coord.state(pid, "ready")
        assert "778" in provider.rentals  # another cluster's rental is left alone
        # the host takes the machine back: lost, node revoked
        provider.fake.vanish(rental.rental_id)
        lost = coord.state(pid, "lost", 15)
        assert "no longer lists" in lost["reason"] and lost["attempts"][-1]["outcome"] == "lost"
        # the node is revoked right after the provision is marked lost (two steps: a reader
        # between them still lists it)
        _until(lambda: node_id not in [n["id"] for n in coord.nodes()], "the lost provision's node revoked", 10)
    finally:
        coord.stop()


def test_download_start_script_by_default_with_an_agent_binary(tmp_path, provider):
    """A coordinator started with --agent-binary gives the rental a start script (Vast.AI's onstart,
    RunPod's entrypoint) carrying the agent's hash and the provision's token, and no token in the
    environment; the token downloads that agent from the coordinator and joins."""
    import hashlib
    import re

    agent = tmp_path / "anex-agent"
    agent.write_bytes(b"#!/bin/sh\nexec true\n")
    digest = hashlib.sha256(agent.read_bytes()).hexdigest()
    coord = Coordinator(tmp_path, f"sqlite:///{tmp_path / 'c.db'}", provider)
    coord.args += ["--agent-binary", f"x86_64={agent}"]
    try:
        coord.start()
        status, created = _call(coord.url, "POST", "/v1/provisions", {**SPEC, "image": "python:3.12-slim"})
        assert status == 202 and created["agent"] == "download", created
        coord.state(created["id"], "booting")
        (rental,) = provider.rentals.values()
        if provider.kind == "vastai":
            assert rental.body["runtype"] == "ssh" and rental.body["onstart"] == rental.onstart
        else:
            assert rental.body["dockerEntrypoint"][:2] == ["/bin/sh", "-c"]
        script = rental.onstart or ""
        assert f"x86_64) sha256={digest}" in script and "exec \"$agent\" run -- sleep infinity" in script
        assert not any(name.startswith("ANEX_") for name in rental.env)
        secret = re.search(r"anexjt_[A-Za-z0-9_-]+", script).group(0)
        request = urllib.request.Request(coord.url + "/v1/agent/x86_64", headers={"Authorization": f"Bearer {secret}"})
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert resp.read() == agent.read_bytes() and resp.headers["X-Checksum-Sha256"] == digest
        env = {"ANEX_JOIN_TOKEN": secret, "ANEX_NODE_NAME": SPEC["name"], "ANEX_PROVIDER": provider.kind}
        node_id = asyncio.run(_agent(coord.url, env))
        assert coord.state(created["id"], "ready")["node_id"] == node_id
    finally:
        stderr = coord.stop()
    assert "anexjt_" not in stderr
