"""The demo's provisioning: a simulated provider whose rentals are node namespaces running the agent.

:class:`SimulatedProvider` serves the simulated rental service (:mod:`anex_agent.demo.rentals`)
on a Unix socket in the work directory, reachable from the coordinator in the gateway namespace
through ``socat`` on ``127.0.0.1:SIM_PORT`` there. "Renting" an offer starts a node namespace
running ``anex-agent run -- <the pod's command>`` with exactly the boot environment the
coordinator gave the rental (coordinator URL, single-use join token, provider, name) plus the
pod's own (``GW_TUNNEL_*``); destroying a rental stops that agent.

:func:`provision_checks` provisions one machine through ``POST /v1/provisions``, waits for it to
be ready, sends a request through its proxy, deletes it, and checks that nothing is left: no
rental, no node at the coordinator, no peer in the gateway's WireGuard interface.
"""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import datetime
from typing import Any

from anex_agent.demo.mesh import COORDINATOR_PORT, HTTP_PORT, SERVICE_NAME, UNDERLAY_GW, Mesh, Node, wait_until
from anex_agent.demo.rentals import RentalService

SIM_PORT = 8710
PROVISION_NAME = "demo-train"
READY_WAIT = 90.0  # seconds from POST /v1/provisions to ready
DELETE_WAIT = 30.0
TUNNEL_PORT = 18080


class SimulatedProvider:
    """Rentals as node namespaces of ``mesh`` (see the module docstring)."""

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        self.service = RentalService()
        self.nodes: dict[str, Node] = {}  # rental id -> its node namespace
        self.started_at: dict[str, float] = {}  # rental id -> when its agent was started (monotonic)

    def start(self) -> dict[str, str]:
        """Serve the rental service; return the coordinator's provisioning environment."""
        sock = self.mesh.workdir / "rentals.sock"
        self.service.start(unix_path=str(sock))
        self.mesh.gateway.popen(["socat", f"TCP-LISTEN:{SIM_PORT},bind=127.0.0.1,fork,reuseaddr", f"UNIX-CONNECT:{sock}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        probe = f"import socket; socket.create_connection(('127.0.0.1', {SIM_PORT}), 2).close()"
        wait_until(lambda: self.mesh.gateway.run([sys.executable, "-c", probe], check=False).returncode == 0, 10,
                   "the simulated rental service in the gateway namespace")
        return {"ANEX_PROVISION_SIMULATOR_URL": f"http://127.0.0.1:{SIM_PORT}",
                "ANEX_PROVISION_COORDINATOR_URL": f"http://{UNDERLAY_GW}:{COORDINATOR_PORT}",
                "ANEX_PROVISION_BOOT_TIMEOUT": "120", "ANEX_PROVISION_RECONCILE_INTERVAL": "5"}

    def serve(self) -> None:
        """Start a node for every new rental; stop the agent of every rental that is gone."""
        for rental_id, rental in list(self.service.rentals.items()):
            if rental_id in self.nodes:
                continue
            node = self.mesh.add_node_namespace()
            boot_env = dict(rental.request.get("env") or {})
            env = self.mesh.agent_env(node, token=boot_env["ANEX_JOIN_TOKEN"], **boot_env)
            command = list(rental.request.get("command") or []) or None
            self.nodes[rental_id] = node
            self.started_at[rental_id] = time.monotonic()
            self.mesh.start_agent(node, env, command, wait_ready=False)
        for rental_id, node in self.nodes.items():
            if rental_id not in self.service.rentals and node.proc is not None:
                self.mesh.stop_agent(node)

    def stop(self) -> None:
        self.service.stop()


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
    body = {"name": PROVISION_NAME, "image": "anex/agent:latest", "command": ["sleep", "3600"],
            "env": {f"GW_TUNNEL_{TUNNEL_PORT}": f"{SERVICE_NAME}:{HTTP_PORT}"},
            "annotations": {"anex.sh/gpu-count": "1"}}
    created = mesh.admin("POST", "/v1/provisions", body)
    assert created is not None
    pid = created["id"]
    deadline = time.monotonic() + READY_WAIT
    view = created
    while time.monotonic() < deadline:
        provider.serve()
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
        provider.serve()
        state = (mesh.admin("GET", f"/v1/provisions/{pid}") or {}).get("state")
        nodes = [n["id"] for n in (mesh.admin("GET", "/v1/nodes") or {}).get("nodes", [])]
        return state == "deleted" and not provider.service.rentals and view["node_id"] not in nodes and \
            public_key not in _peers(mesh)

    try:
        wait_until(gone, DELETE_WAIT, "the provision deleted", interval=0.2)
        checks.append(("delete", True, f"rental destroyed, node removed, peer gone from the gateway in "
                                       f"{time.monotonic() - started:.1f} s"))
    except TimeoutError as err:
        left = [f"rentals {sorted(provider.service.rentals)}"] if provider.service.rentals else []
        checks.append(("delete", False, f"{err}; left: {', '.join(left) or 'a node or a peer'}"))
    return checks, status
