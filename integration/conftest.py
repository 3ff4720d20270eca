"""End-to-end harness: a whole mesh in network namespaces, real processes, shared by the tests.

* ``mesh`` (session): the ``cluster`` namespace (HTTP echo services, DNS knowing
  ``echo.default.svc.cluster.local``, bulk source/sink), the ``gateway`` namespace with the
  coordinator and ``anex-agent gateway`` (wireguard-go hub, --route to the cluster), all
  started with the CLI users run. Built by :class:`anex_agent.testing.mesh.Mesh` (the demo
  builds the very same mesh), torn down afterwards: processes stopped, namespaces (and
  with them every veth link) deleted.
* ``node`` (module): one node namespace with ``anex-agent daemon`` up and ready (a
  handshake with the gateway), two ``GW_TUNNEL_*`` forwards.
* ``control_plane`` (session): a real Kubernetes control plane on 127.0.0.1 (etcd,
  kube-apiserver, kube-scheduler, kube-controller-manager; no kubelet), ready, with an admin
  kubeconfig for ``kubectl``: see :mod:`integration.kube`. Skipped, with the reason, where
  its programs are missing (``scripts/install-tools kube etcd`` builds them). Tests share it:
  each works in its own namespace and removes the cluster-scoped objects it made.
* ``in_ns(ns, *args)``: run ``python -m anex_agent.testing.probe_client ARGS`` inside a namespace
  and return its JSON result.

Everything is skipped, with the reason, where root, ``ip``, ``wireguard-go`` or ``nft`` is
missing, or where the coordinator/gateway CLI is not in this build.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from anex_agent.testing.mesh import Mesh, SERVICE2_NAME, SERVICE_NAME, HTTP2_PORT, HTTP_PORT, anex_argv
from anex_agent.testing.netlab import missing_prerequisites
from integration.kube import ControlPlane, kube_skip_reason

TUNNEL_1 = 18080
TUNNEL_2 = 18081


def mesh_skip_reason() -> str | None:
    reason = missing_prerequisites("wireguard-go", "nft")
    if reason:
        return reason
    for module in ("anex_agent.coordinator.cli", "anex_agent.gateway.cli"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not in this build"
    return None


def client(ns, *args: str, timeout: float = 30) -> dict:
    """Run the demo client inside ``ns``; return its JSON result (``error`` key on failure)."""
    out = ns.run([sys.executable, "-m", "anex_agent.testing.probe_client", *args], check=False, timeout=timeout)
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": f"client crashed: {out.stderr[-1000:]}"}


@pytest.fixture(scope="session")
def mesh():
    reason = mesh_skip_reason()
    if reason:
        pytest.skip(reason)
    workdir = Path(tempfile.mkdtemp(prefix="anex-it-"))
    built = Mesh(workdir)
    try:
        built.build_network()
        single_file = os.environ.get("ANEX_SINGLE_FILE", "")
        if single_file and Path(single_file).is_file():  # scripts/test-single-file: rented machines download it
            built.coordinator_args += ["--agent-binary", single_file]
        built.start_coordinator()
        built.start_gateway()
        yield built
    finally:
        built.close()


@pytest.fixture(scope="session")
def control_plane():
    reason = kube_skip_reason()
    if reason:
        pytest.skip(reason)
    workdir = Path(tempfile.mkdtemp(prefix="anex-kube-"))
    try:
        with ControlPlane(workdir) as cp:
            yield cp
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def node(mesh):
    """A node running ``anex-agent daemon`` with two GW_TUNNEL forwards, ready."""
    n = mesh.add_node_namespace()
    env = mesh.agent_env(
        n,
        **{f"GW_TUNNEL_{TUNNEL_1}": f"{SERVICE_NAME}:{HTTP_PORT}", f"GW_TUNNEL_{TUNNEL_2}": f"{SERVICE2_NAME}:{HTTP2_PORT}"},
    )
    mesh.start_agent(n, env)
    yield n
    mesh.stop_agent(n)


def dump_logs(mesh: Mesh) -> str:
    parts = []
    for path in sorted(Path(mesh.workdir).glob("*.log")):
        parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}")
    return "\n".join(parts)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On a failed integration test, attach the tail of every process log to the report."""
    outcome = yield
    report = outcome.get_result()
    funcargs = getattr(item, "funcargs", {})
    if report.failed and "mesh" in funcargs:
        report.sections.append(("mesh process logs", dump_logs(funcargs["mesh"])))
    if report.failed and "control_plane" in funcargs:
        report.sections.append(("control plane logs", funcargs["control_plane"].logs()))


def read_until(proc: subprocess.Popen, predicate, timeout: float) -> list[str]:
    """Lines of ``proc.stdout`` (text mode) until ``predicate(lines)`` is true, EOF or ``timeout``.

    Never blocks past the deadline (a bare ``for line in proc.stdout`` would, when nothing
    more is printed).
    """
    import os
    import selectors
    import time

    lines: list[str] = []
    buf = b""
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while time.monotonic() < deadline and not predicate(lines):
            if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            buf += chunk
            *complete, buf = buf.split(b"\n")
            lines += [c.decode(errors="replace") + "\n" for c in complete]
    return lines


def finish(ns, proc: subprocess.Popen, timeout: float = 30) -> tuple[int, str]:
    """Wait for ``proc`` (started with stdout=PIPE) and return (status, rest of its output).

    On timeout every process in the namespace is killed first, so that a grandchild holding
    the pipe (the workload) cannot make the final read block forever.
    """
    import os
    import signal

    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid in ns.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out, _ = proc.communicate(timeout=10)
    return proc.returncode, out or ""


@pytest.fixture
def fresh_node(mesh):
    """A node namespace of the session mesh for one test alone; its agent is stopped afterwards."""
    n = mesh.add_node_namespace()
    yield n
    mesh.stop_agent(n)


def run_agent(node, env, args, timeout=60) -> subprocess.CompletedProcess:
    """``anex-agent run ARGS`` in the node's namespace, bounded by ``timeout`` (stdout and stderr apart)."""
    proc = node.ns.popen([*anex_argv(), "run", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        finish(node.ns, proc, 0.1)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def ns_state(ns) -> dict:
    """What of ours exists in a namespace: interfaces, routes, nftables tables, processes."""
    links = [l.split(": ")[1].split("@")[0] for l in ns.run(["ip", "-o", "link"]).stdout.splitlines()]
    routes = ns.run(["ip", "route", "show", "table", "all"]).stdout.splitlines()
    nft = subprocess.run(ns.argv(["nft", "list", "tables"]), capture_output=True, text=True).stdout.split()
    return {
        "interfaces": [l for l in links if l.startswith("anx") and not l.startswith(("anxda", "anxdb"))],
        "routes": [r for r in routes if " anx" in r and "anxd" not in r],
        "nft_tables": [t for t in nft if t.startswith("anex")],
        "pids": ns.pids(),
    }


def assert_agent_api_needs_the_cluster_token(mesh, status: dict) -> None:
    """The agent API at the node's mesh address, called from the cluster: no token 401, a
    forged one 403, an issued one 200 once (a replay 401)."""
    url = f"http://{status['address']}:9555/status"
    code = (
        "import sys,urllib.request,urllib.error\n"
        "req=urllib.request.Request(sys.argv[1],headers={'Authorization':'Bearer '+sys.argv[2]} if sys.argv[2] else {})\n"
        "try: print(urllib.request.urlopen(req,timeout=5).status)\n"
        "except urllib.error.HTTPError as e: print(e.code)\n"
    )

    def call(token: str) -> int:
        return int(mesh.cluster.run([sys.executable, "-c", code, url, token]).stdout.strip())

    assert call("") == 401
    assert call("anexat.forged.token") == 403
    issued = mesh.admin("POST", f"/v1/nodes/{status['node_id']}/access-token")
    assert call(issued["token"]) == 200
    assert call(issued["token"]) == 401  # one token, one call: a replay is refused
    assert call(mesh.admin("POST", f"/v1/nodes/{status['node_id']}/access-token")["token"]) == 200
