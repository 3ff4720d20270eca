"""Provisioning in a real coordinator process (``python -m anex_agent coordinator``) against the
simulated rental service (anex_agent/demo/rentals.py), SQLite and PostgreSQL:

* the coordinator is killed (SIGKILL) while its rent call is in flight (the rental exists, the
  answer never came); restarted on the same database it adopts that rental: exactly one rental
  exists, the machine's agent joins with the boot token it was given, the provision is ready;
  DELETE leaves no rental and no node;
* a 400 on the first candidate and a 503 on the next call: the second candidate is rented once;
* a dangling labelled rental is destroyed at start; a rental that vanishes makes the provision lost.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request

import pytest

from anex_agent import keys, wire
from anex_agent.client import CoordinatorClient
from anex_agent.demo.rentals import RentalService
from tests.coordinator.conftest import BACKENDS, backend_url
from tests.coordinator.coordinator_process import CoordinatorProcess

ADMIN = "anexadm_test_admin_token_for_provisioning"
SPEC = {"name": "job-1", "image": "anex/agent:latest", "command": ["sleep", "infinity"]}


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


class Coordinator:
    def __init__(self, tmp_path, database: str, sim: RentalService, **env: str) -> None:
        self.args = ["--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "state"), "--database", database,
                     "--heartbeat-flush-interval", "0"]
        self.env = {**os.environ, "ANEX_ADMIN_TOKEN": ADMIN, "ANEX_PROVISION_SIMULATOR_URL": sim.url,
                    "ANEX_PROVISION_COORDINATOR_URL": "http://coordinator.invalid:8700",
                    "ANEX_PROVISION_LEASE": "2", "ANEX_PROVISION_BOOT_TIMEOUT": "120", **env}
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

    def view(self, pid: str) -> dict:
        status, body = _call(self.url, "GET", f"/v1/provisions/{pid}")
        assert status == 200, body
        return body

    def state(self, pid: str, state: str, timeout: float = 30.0) -> dict:
        return _until(lambda: (v := self.view(pid))["state"] == state and v, f"state {state}", timeout)


async def _agent(url: str, env: dict) -> str:
    """What the agent on the rented machine does with its boot env: join, heartbeat."""
    async with CoordinatorClient(url) as client:
        joined = await client.join(env["ANEX_JOIN_TOKEN"], keys.KeyPair(keys.generate_private_key()),
                                   env["ANEX_NODE_NAME"], env["ANEX_PROVIDER"])
        client.set_credential(joined.credential)
        await client.heartbeat(joined.node_id, wire.Heartbeat())
        return joined.node_id


@pytest.fixture
def sim():
    service = RentalService()
    service.start()
    yield service
    service.stop()


@pytest.mark.parametrize("backend", BACKENDS)
async def test_sigkill_mid_rent_then_restart_adopts_exactly_one_rental(tmp_path, sim, backend):
    async with backend_url(backend, tmp_path) as database:
        coord = Coordinator(tmp_path, database, sim)
        sim.faults["rent"] = ["hang"]
        try:
            coord.start()
            status, created = _call(coord.url, "POST", "/v1/provisions", SPEC)
            assert status == 202, created
            pid = created["id"]
            _until(lambda: sim.rentals, "the rental")
            coord.kill()  # the rent call is in flight: the rental exists, the coordinator never learned its id
            assert len(sim.rentals) == 1
            coord.start()
            view = coord.state(pid, "booting")
            (rental,) = sim.rentals.values()
            assert view["rental_id"] == rental.rental_id and sim.rent_calls == ["sim-1"]
            node_id = await _agent(coord.url, rental.request["env"])
            ready = coord.state(pid, "ready")
            assert ready["node_id"] == node_id and len(sim.rentals) == 1
            assert ready["price_per_hour"] == pytest.approx(0.3)
            status, _ = _call(coord.url, "DELETE", f"/v1/provisions/{pid}")
            assert status == 202
            coord.state(pid, "deleted")
            assert sim.rentals == {} and sim.destroyed == [rental.rental_id]
            status, nodes = _call(coord.url, "GET", "/v1/nodes")
            assert nodes["nodes"] == []
        finally:
            stderr = coord.stop()
        assert "anexjt_" not in stderr  # the boot token is never logged


async def test_refused_then_unavailable_then_rented_once_and_pruning(tmp_path, sim):
    database = f"sqlite:///{tmp_path / 'c.db'}"
    coord = Coordinator(tmp_path, database, sim, ANEX_PROVISION_RECONCILE_INTERVAL="1")
    sim.faults["rent"] = [400, 503]
    try:
        coord.start()
        status, created = _call(coord.url, "POST", "/v1/provisions", SPEC)
        pid = created["id"]
        view = coord.state(pid, "booting")
        assert sim.rent_calls == ["sim-1", "sim-2", "sim-2"] and len(sim.rentals) == 1
        assert [a["outcome"] for a in view["attempts"]] == ["refused", None]
        # a rental carrying our cluster's label but no live provision's id is destroyed
        (rental,) = sim.rentals.values()
        cluster_prefix = rental.label.rsplit(":", 1)[0] + ":"
        sim.rentals["sim-stray"] = type(rental)("sim-stray", "sim-3", cluster_prefix + "pv-gone", 0.4, {})
        _until(lambda: "sim-stray" in sim.destroyed, "the dangling rental destroyed", 15)
        await _agent(coord.url, rental.request["env"])
        coord.state(pid, "ready")
        # the host takes the machine back: lost, node revoked
        sim.vanish(rental.rental_id)
        lost = coord.state(pid, "lost", 15)
        assert "no longer lists" in lost["reason"]
        status, nodes = _call(coord.url, "GET", "/v1/nodes")
        assert nodes["nodes"] == []
    finally:
        coord.stop()
