"""``anex-agent demo --check`` as users run it, and the pieces that read the coordinator's view.

* :func:`test_demo_check_passes_and_shows_each_nodes_heartbeat_and_telemetry` runs the real
  command (root: it builds its own mesh in network namespaces; skipped with the reason
  elsewhere) and checks the exit status, every path row, that the coordinator reported
  each node ready with a health verdict, its NVML state and its series on ``/metrics``, and,
  where the control-plane programs are built, the example pod's rows (scheduled, running,
  logs, exec, succeeded); where they are not, the one line saying so.
* The other tests need no privileges: they feed the demo's readers
  (:mod:`anex_agent.demo.observe`) what the real producers make here, a telemetry block
  sampled on this machine by :class:`anex_agent.gpu.monitor.TelemetryMonitor` and the
  coordinator's fleet collector's exposition of it, so a change of either shape breaks them.
"""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from anex_agent.demo import coordinator_checks, kubernetes, view_cells
from anex_agent.testing.mesh import anex_argv
from anex_agent.testing.netlab import missing_prerequisites
from anex_agent.demo.observe import REQUIRED_SERIES, complete, node_series, summarize
from integration.conftest import mesh_skip_reason

NODE = "native-1"
#: node label -> (engine, path, node name) of each node the demo runs
NODES = {"native-1": ("wireguard-go", "udp", "demo-node-1"), "udp-blocked-2": ("wireguard-go", "websocket", "demo-node-2"),
         "unprivileged-3": ("userspace", "udp", "demo-node-3")}
PATH_CHECKS = ("path", "proxy", "post", "connect", "tunnel", "inbound")
COORDINATOR_CHECKS = ("heartbeat", "telemetry", "metrics")
PROVISION_CHECKS = ("provision", "proxy", "delete")
KUBERNETES_CHECKS = ("scheduled", "running", "logs", "exec", "succeeded")
VERDICT = r"(healthy|degraded|unhealthy)"


def _row(text: str, check: str, node: str = NODE) -> str:
    """The check table's line for ``node`` and ``check``."""
    for line in text.splitlines():
        if re.match(rf"{node}\s+\S+\s+\S+\s+(never|-|\d+ s ago)\s+{check}\s", line):
            return line
    raise AssertionError(f"no {check!r} row for {node} in:\n{text}")


def test_demo_check_passes_and_shows_each_nodes_heartbeat_and_telemetry(tmp_path):
    reason = mesh_skip_reason() or missing_prerequisites("socat", "wg")  # the demo's provisioning needs both
    if reason:
        pytest.skip(reason)
    proc = subprocess.run([*anex_argv(), "demo", "--check", "--keep-logs", str(tmp_path)],
                          capture_output=True, text=True, timeout=240)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    assert "Traceback" not in text, text
    for node, (engine, path, name) in NODES.items():  # native; UDP blocked (on the relay); unprivileged (userspace)
        for check in PATH_CHECKS + COORDINATOR_CHECKS:
            assert re.search(r"\sok\s", _row(text, check, node)), _row(text, check, node)
            assert re.match(rf"{node}\s+{engine}\s+{path}\s", _row(text, check, node))
        assert re.search(rf"ok  {path}: ", _row(text, "path", node))
        assert re.search(rf"ready at the coordinator, 10\.254\.\d+\.\d+, {engine}/{path}", _row(text, "heartbeat", node))
        assert re.search(rf"ok  {VERDICT}, nvml \w+, \d+ GPUs, sampled [\d.]+ s ago", _row(text, "telemetry", node))
        assert re.search(rf'ok  \d+ series with node="{name}" on /metrics', _row(text, "metrics", node))
        # the coordinator's view table: state, address, engine, path, NVML, GPUs, ..., health verdict and reason
        view = [line for line in text.split("the coordinator's view of each node:", 1)[-1].splitlines() if line.startswith(node)]
        assert len(view) == 1, text
        assert re.match(rf"{node}\s+ready\s+10\.254\.\d+\.\d+\s+{engine}\s+{path}\s+\w+\s+\d+\s+[\d.]+ %\s+[\d.]+ GiB / [\d.]+ GiB\s+[\d.]+ s ago\s+{VERDICT}", view[0]), view[0]
    assert "no WireGuard handshake" in _row(text, "path", "udp-blocked-2")
    # provisioning: POST /v1/provisions -> a simulated rental boots the agent -> ready; proxy; DELETE leaves nothing
    assert re.search(r"ok  ready in [\d.]+ s \(select [\d.]+, rent [\d.]+, boot [\d.]+, join [\d.]+\); vastai \d+ at "
                     r"\$[\d.]+/h, node 10\.254\.\d+\.\d+", _row(text, "provision", "provisioned")), text
    assert re.search(r"ok  echo answered /provisioned", _row(text, "proxy", "provisioned")), text
    assert re.search(r"ok  rental destroyed, node removed, peer gone from the gateway", _row(text, "delete", "provisioned"))
    expected = len(NODES) * len(PATH_CHECKS + COORDINATOR_CHECKS) + len(PROVISION_CHECKS)
    if kubernetes.skip_reason() is None:  # the example pod through the real control plane and the virtual node
        assert re.search(r"ok  default-scheduler: default/my-gpu-workload bound to anex-vastai in ",
                         _row(text, "scheduled", "kubernetes"))
        assert re.search(r"ok  Running in [\d.]+ s; pod IP 10\.254\.\d+\.\d+, the mesh address of vastai rental \d+",
                         _row(text, "running", "kubernetes"))
        assert f"ok  kubectl logs: '{kubernetes.POD_LINE}'" in _row(text, "logs", "kubernetes")
        assert re.search(rf"ok  kubectl exec .* exited {kubernetes.EXEC_STATUS}, printed '{kubernetes.EXEC_LINE}'",
                         _row(text, "exec", "kubernetes"))
        assert re.search(r"ok  Succeeded \(exit 0, Completed\); deleted, 0 rentals left",
                         _row(text, "succeeded", "kubernetes"))
        assert re.match(r"kubernetes\s+wireguard-go\s+udp\s", _row(text, "running", "kubernetes"))
        expected += len(KUBERNETES_CHECKS)
    else:
        assert f"anex-agent demo: no Kubernetes rows: {kubernetes.skip_reason()}\n" in text
        assert not re.search(r"^kubernetes\s", text, re.M)
    summary = re.search(r"(\d+)/(\d+) checks passed", text)
    assert summary and summary.group(1) == summary.group(2) == str(expected), text


# ---------------------------------------------------------------- readers, against the real producers


@pytest.fixture(scope="module")
def telemetry_here(tmp_path_factory) -> dict:
    """The heartbeat block this machine's agent would send (real NVML/psutil path; no GPU here is fine)."""
    from anex_agent.gpu.monitor import TelemetryMonitor

    monitor = TelemetryMonitor(state_dir=str(tmp_path_factory.mktemp("state")))
    try:
        monitor.collect()
        block = monitor.telemetry()
    finally:
        monitor.close()
    assert block is not None
    return block


def _fleet_exposition(nodes: dict[str, tuple[str, dict]]) -> str:
    """What the coordinator's ``/metrics`` serves for ``nodes`` (id -> (name, telemetry))."""
    from anex_agent.coordinator.routes.fleet_metrics import FleetTelemetry, exposition

    fleet = FleetTelemetry(db=None, clock=time.time)
    fleet.nodes = {node_id: (name, 0.0, json.dumps(block)) for node_id, (name, block) in nodes.items()}
    return exposition(fleet).decode()


def _view(name: str) -> dict:
    return {"id": "n1", "name": name, "state": "ready", "address": "10.254.0.2", "health": "unknown",
            "status": {"engine": "wireguard-go", "path": "udp", "last_handshake_age": 1.5}}


def test_node_series_finds_each_nodes_fleet_series_and_only_its_own(telemetry_here):
    text = _fleet_exposition({"id-a": ("node-a", telemetry_here), "id-b": ("node-b", telemetry_here)})
    series = node_series(text, ["node-a", "node-b", "node-c"])
    for name in ("node-a", "node-b"):
        assert set(REQUIRED_SERIES) <= set(series[name]), series[name]
        assert all(s.startswith(("anex_", "DCGM_")) for s in series[name])
    assert series["node-c"] == []


def test_summarize_reads_the_real_block_and_the_node_is_complete(telemetry_here):
    series = node_series(_fleet_exposition({"n1": ("demo-node-1", telemetry_here)}), ["demo-node-1"])["demo-node-1"]
    s = summarize(_view("demo-node-1"), telemetry_here, series, now=telemetry_here["taken_at"] + 2.0)
    assert s["verdict"] == telemetry_here["health"]["verdict"]
    assert s["first_reason"] == (telemetry_here["health"]["reasons"] or [None])[0]
    assert s["nvml"] == telemetry_here["nvml"]["state"]
    assert s["gpu_count"] == telemetry_here["inventory"]["gpu_count"]
    host = telemetry_here["host"]
    assert s["mem_used_bytes"] == host["mem_total_bytes"] - host["mem_available_bytes"]
    assert s["telemetry_age"] == pytest.approx(2.0)
    assert (s["state"], s["address"], s["engine"], s["path"]) == ("ready", "10.254.0.2", "wireguard-go", "udp")
    s["errors"] = []
    assert complete(s)
    checks = {name: (ok, detail) for name, ok, detail in coordinator_checks(s, None, 20)}
    assert all(ok for ok, _ in checks.values()), checks
    cells = view_cells("native-1", s)
    assert cells[:5] == ("native-1", "ready", "10.254.0.2", "wireguard-go", "udp")
    assert cells[-1].startswith(s["verdict"])


def test_a_node_without_telemetry_or_series_fails_its_checks(telemetry_here):
    s = summarize(_view("demo-node-1"), None, [], now=time.time())
    s["errors"] = []
    assert not complete(s)
    checks = {name: (ok, detail) for name, ok, detail in coordinator_checks(s, None, 20)}
    assert checks["heartbeat"][0] is True
    assert checks["telemetry"] == (False, "no telemetry with a health verdict within 20 s")
    assert checks["metrics"][0] is False and "anex_node_health" in checks["metrics"][1]
    # telemetry there but the fleet series not (yet) on /metrics: only that check fails
    s = summarize(_view("demo-node-1"), telemetry_here, ["anex_node_health"], now=time.time())
    checks = {name: ok for name, ok, _ in coordinator_checks(s, None, 20)}
    assert checks == {"heartbeat": True, "telemetry": True, "metrics": False}


def test_no_answer_from_the_coordinator_fails_every_coordinator_check():
    checks = coordinator_checks(None, "observing the coordinator failed: timed out", 20)
    assert [(name, ok) for name, ok, _ in checks] == [(name, False) for name in COORDINATOR_CHECKS]
    assert all("timed out" in detail for _, _, detail in checks)
