"""The demo's provisioning: the fake Vast.AI as the provider, its rentals node namespaces running the agent.

:class:`SimulatedProvider` serves :class:`~anex_agent.testing.fake_providers.FakeVastAI` (offers,
rent, list, destroy, as Vast.AI's API answers them) on a Unix socket in the work directory,
reachable from the coordinator in the gateway namespace through ``socat`` on
``127.0.0.1:SIM_PORT`` there; the coordinator rents from it with its real Vast.AI client
(``ANEX_VASTAI_URL``, ``ANEX_VASTAI_API_KEY``). Its ``on_rent`` hook starts a node namespace
running ``anex-agent run -- <the pod's command>`` with exactly the environment the coordinator
gave the rental (coordinator URL, single-use join token, provider, name, the pod's
``GW_TUNNEL_*``), the way the agent image's entrypoint would; ``on_destroy`` stops that agent.
:attr:`SimulatedProvider.boot_for` says how each rental's machine boots (:class:`Boot`): by
default as a host that gives the agent NET_ADMIN (wireguard-go); a test may make some rentals
unprivileged (the built-in engine) and/or drop their UDP (the WebSocket path).

:func:`provision_checks` provisions one machine through ``POST /v1/provisions``, waits for it to
be ready, sends a request through its proxy, deletes it, and checks that nothing is left: no
rental, no node at the coordinator, no peer in the gateway's WireGuard interface.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from anex_agent.testing.fake_providers import FakeRental, FakeVastAI, ThreadedFake, vast_bundle
from anex_agent.testing.mesh import COORDINATOR_PORT, HTTP_PORT, SERVICE_NAME, UNDERLAY_GW, Mesh, Node, wait_until

SIM_PORT = 8710
API_KEY = "demo-vastai-api-key"  # the fake's; a real key is never needed here
PROVISION_NAME = "demo-train"
READY_WAIT = 90.0  # seconds from POST /v1/provisions to ready
DELETE_WAIT = 30.0
TUNNEL_PORT = 18080
#: one-GPU offers for the provision check, the cheapest; two-GPU ones for the example pod's
#: annotations (two RTX 4090s in Europe, verified, in a datacenter: see :mod:`anex_agent.demo.kubernetes`)
OFFERS = [vast_bundle(5001, price=0.3), vast_bundle(5002, price=0.35), vast_bundle(5003, price=0.4),
          vast_bundle(5101, gpus=2, price=0.6), vast_bundle(5102, gpus=2, price=0.65)]


@dataclass(frozen=True)
class Boot:
    """How a rental's machine boots. ``unprivileged``: the agent runs as nobody with no capabilities
    (``Mesh.start_agent(unprivileged=True)``), ``ANEX_ENGINE=auto`` picking the built-in engine;
    ``udp_blocked``: the machine's namespace drops every outgoing UDP datagram (``Mesh.block_udp``)
    and ``ANEX_PATH=auto`` finds the gateway's WebSocket relay; ``memory_limit``: the machine's
    container has that many bytes (the agent and its workload in a memory cgroup of their own,
    where a workload that outgrows it is OOM-killed)."""

    unprivileged: bool = False
    udp_blocked: bool = False
    memory_limit: int | None = None


class SimulatedProvider:
    """The fake Vast.AI whose rentals are node namespaces of ``mesh`` (see the module docstring)."""

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        self.fake = FakeVastAI(api_key=API_KEY, bundles=list(OFFERS), on_rent=self._on_rent,
                               on_destroy=self._on_destroy)
        self.served = ThreadedFake(self.fake)
        self.nodes: dict[str, Node] = {}  # rental id -> its node namespace
        self.started_at: dict[str, float] = {}  # rental id -> when its agent was started (monotonic)
        self.boot_for: Callable[[FakeRental], Boot] = lambda rental: Boot()  # read as each rental boots

    def start(self) -> dict[str, str]:
        """Serve the fake Vast.AI; return the coordinator's provider and provisioning environment."""
        sock = self.mesh.workdir / "vastai.sock"
        self.served.start(unix_path=str(sock))
        self.mesh.gateway.popen(["socat", f"TCP-LISTEN:{SIM_PORT},bind=127.0.0.1,fork,reuseaddr", f"UNIX-CONNECT:{sock}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        probe = f"import socket; socket.create_connection(('127.0.0.1', {SIM_PORT}), 2).close()"
        wait_until(lambda: self.mesh.gateway.run([sys.executable, "-c", probe], check=False).returncode == 0, 10,
                   "the fake Vast.AI in the gateway namespace")
        return {"ANEX_VASTAI_URL": f"http://127.0.0.1:{SIM_PORT}{self.fake.base_path()}",
                "ANEX_VASTAI_API_KEY": API_KEY,
                "ANEX_PROVISION_COORDINATOR_URL": f"http://{UNDERLAY_GW}:{COORDINATOR_PORT}",
                "ANEX_PROVISION_BOOT_TIMEOUT": "120", "ANEX_PROVISION_RECONCILE_INTERVAL": "5"}

    @property
    def rentals(self) -> dict[str, FakeRental]:
        return self.fake.rentals

    async def _on_rent(self, rental: FakeRental) -> None:
        # the machine boots after the rent is answered, as a real one does: not awaited here
        rental.handle = asyncio.get_running_loop().run_in_executor(None, self._boot, rental)

    def _boot(self, rental: FakeRental) -> None:
        boot = self.boot_for(rental)
        node = self.mesh.add_node_namespace()
        env = self.mesh.agent_env(node, token=rental.env["ANEX_JOIN_TOKEN"], **rental.env)
        if boot.unprivileged:
            env["ANEX_ENGINE"] = "auto"
        if boot.udp_blocked:
            env["ANEX_PATH"] = "auto"
            self.mesh.block_udp(node)
        self.nodes[rental.rental_id] = node
        self.started_at[rental.rental_id] = time.monotonic()
        self.mesh.start_agent(node, env, list(rental.command) or None, wait_ready=False,
                              unprivileged=boot.unprivileged, memory_limit=boot.memory_limit)

    async def _on_destroy(self, rental: FakeRental) -> None:
        if rental.handle is not None:
            await asyncio.wait([rental.handle])
        node = self.nodes.get(rental.rental_id)
        if node is not None and node.proc is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.mesh.stop_agent, node)

    def stop(self) -> None:
        self.served.stop()


def _ts(text: str | None) -> float | None:
    return datetime.fromisoformat(text).timestamp() if text else None


def phases(view: dict[str, Any], node_created_at: str | None) -> dict[str, float]:
    """Seconds of each phase from POST to ready: select (until the attempt that succeeded began),
    rent (the rent call), boot (rented until the node joined), join (joined until ready)."""
    attempt = view["attempts"][-1]
    created, started = _ts(view["created_at"]), _ts(attempt["started_at"])
    rented, joined, ready = _ts(attempt["rented_at"]), _ts(node_created_at), _ts(view["ready_at"])
    return {"select": started - created, "rent": rented - started, "boot": joined - rented, "join": ready - joined,
            "total": ready - created}


def _peers(mesh: Mesh) -> set[str]:
    keys: set[str] = set()
    for iface in mesh.gateway_interfaces():
        out = mesh.gateway.run(["wg", "show", iface, "peers"], check=False)
        keys.update(out.stdout.split())
    return keys


def provision_checks(mesh: Mesh, provider: SimulatedProvider, proxy_check) -> tuple[list[tuple[str, bool, str]], dict]:
    """``provision``, ``proxy`` and ``delete`` checks (see the module docstring), and the agent's
    ``/status`` while it ran. ``proxy_check(node)`` returns ``(ok, detail)`` for a request through
    the node's proxy."""
    checks: list[tuple[str, bool, str]] = []
    body = {"name": PROVISION_NAME, "image": "anex/agent:latest", "agent": "entrypoint", "command": ["sleep", "3600"],
            "env": {f"GW_TUNNEL_{TUNNEL_PORT}": f"{SERVICE_NAME}:{HTTP_PORT}"},
            "annotations": {"anex.sh/gpu-count": "1"}}
    created = mesh.admin("POST", "/v1/provisions", body)
    assert created is not None
    pid = created["id"]
    deadline = time.monotonic() + READY_WAIT
    view = created
    while time.monotonic() < deadline:
        view = mesh.admin("GET", f"/v1/provisions/{pid}") or {}
        if view.get("state") in ("ready", "failed"):
            break
        time.sleep(0.2)
    if view.get("state") != "ready":
        checks.append(("provision", False, f"{view.get('state')}: {view.get('reason')}"))
        return checks, {}
    node_view = mesh.admin("GET", f"/v1/nodes/{view['node_id']}") or {}
    split = phases(view, node_view.get("created_at"))
    checks.append(("provision", True, (
        f"ready in {split['total']:.1f} s (select {split['select']:.2f}, rent {split['rent']:.2f}, boot "
        f"{split['boot']:.1f}, join {split['join']:.1f}); {view['provider']} {view['rental_id']} at "
        f"${view['price_per_hour']}/h, node {view['address']}")))
    node = provider.nodes[view["rental_id"]]
    status: dict = {}
    try:
        status = mesh.wait_agent_ready(node)
        checks.append(("proxy", *proxy_check(node)))
    except Exception as err:  # report, do not crash the table
        checks.append(("proxy", False, str(err).splitlines()[0][:200]))
    public_key = node_view.get("public_key")
    started = time.monotonic()
    mesh.admin("DELETE", f"/v1/provisions/{pid}")

    def gone() -> bool:
        state = (mesh.admin("GET", f"/v1/provisions/{pid}") or {}).get("state")
        nodes = [n["id"] for n in (mesh.admin("GET", "/v1/nodes") or {}).get("nodes", [])]
        return state == "deleted" and not provider.rentals and view["node_id"] not in nodes and \
            public_key not in _peers(mesh)

    try:
        wait_until(gone, DELETE_WAIT, "the provision deleted", interval=0.2)
        checks.append(("delete", True, f"rental destroyed, node removed, peer gone from the gateway in "
                                       f"{time.monotonic() - started:.1f} s"))
    except TimeoutError as err:
        left = [f"rentals {sorted(provider.rentals)}"] if provider.rentals else []
        checks.append(("delete", False, f"{err}; left: {', '.join(left) or 'a node or a peer'}"))
    return checks, status
