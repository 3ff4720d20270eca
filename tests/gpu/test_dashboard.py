"""NVIDIA's dcgm-exporter Grafana dashboard against our /metrics: every panel's metrics and labels exist.

The dashboard (``dcgm_exporter/dcgm-exporter-dashboard.json``, copied from NVIDIA/dcgm-exporter, see
the README there) is read as data: every panel's ``expr`` and every template variable's
``label_values(metric, label)`` query. From each we take the metric names, the label matchers
(``{instance=~"$instance", gpu=~"$gpu"}``) and the ``by (...)`` labels, and check them against:

* the agent's ``/metrics`` from two fake GPUs, one GPM-capable (H100) and one not (A100): every
  metric exists, every label a query matches or groups by is on its series (``instance`` and
  ``job`` are the target labels Prometheus adds on scrape), and every panel has data on the
  GPM-capable GPU;
* the coordinator's fleet ``/metrics`` with two nodes whose GPUs have the same indexes, after the
  documented relabelling (``instance`` from ``node``): the ``instance`` and ``gpu`` variables
  select one node's GPUs only, so a panel's ``avg``/``sum`` is per node, not across the fleet.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from anex_agent.coordinator.routes.fleet_metrics import exposition as fleet_exposition
from anex_agent.gpu.exposition import register_collectors
from anex_agent.gpu.monitor import TelemetryMonitor
from anex_agent.telemetry.options import ExpositionOptions

from anex_agent.testing.fake_nvml import FakeGpu

FIXTURES = Path(__file__).parent / "dcgm_exporter"
TARGET_LABELS = {"instance", "job"}  # added by Prometheus to every series of a scrape target
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}


# ---------------------------------------------------------------------- the dashboard as data

def dashboard() -> dict:
    return json.loads((FIXTURES / "dcgm-exporter-dashboard.json").read_text())


def panels() -> list[tuple[str, str]]:
    """(panel title, expr) for every query of every panel (rows' nested panels too)."""
    out = []

    def walk(items):
        for panel in items:
            for target in panel.get("targets", []):
                if target.get("expr"):
                    out.append((panel.get("title", ""), target["expr"]))
            walk(panel.get("panels", []))

    walk(dashboard()["panels"])
    return out


def variables() -> list[tuple[str, str, str]]:
    """(variable, metric, label) of every ``label_values(metric, label)`` template variable."""
    out = []
    for var in dashboard().get("templating", {}).get("list", []):
        match = re.fullmatch(r"\s*label_values\(\s*([A-Za-z_:][\w:]*)\s*,\s*(\w+)\s*\)\s*", str(var.get("query", "")))
        if match:
            out.append((var["name"], match.group(1), match.group(2)))
    return out


def parse_query(expr: str) -> tuple[dict[str, list[tuple[str, str, str]]], set[str]]:
    """A small PromQL reader: {metric: [(label, op, value), ...]} and the ``by``/``without`` labels."""
    metrics: dict[str, list[tuple[str, str, str]]] = {}
    grouping: set[str] = set()
    for match in re.finditer(r"\b(by|without)\s*\(([^)]*)\)", expr):
        grouping |= {label.strip() for label in match.group(2).split(",") if label.strip()}
    text = re.sub(r"\b(by|without)\s*\([^)]*\)", " ", expr)
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery durations: [5m]
    text = re.sub(r'"(?:[^"\\]|\\.)*"', lambda m: m.group(0).replace("(", " ").replace(")", " "), text)
    for match in re.finditer(r"([A-Za-z_:][\w:]*)\s*(\{[^}]*\})?\s*(\()?", text):
        name, selector, call = match.group(1), match.group(2), match.group(3)
        start = match.start()
        if call and not selector or name in KEYWORDS or (start > 0 and text[start - 1] in '"$.'):
            continue
        if name.lower() in ("inf", "nan") or re.fullmatch(r"\d.*", name):
            continue
        matchers = re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', selector or "")
        metrics.setdefault(name, []).extend(matchers)
    return metrics, grouping


def test_the_reader_finds_metrics_matchers_and_grouping():
    metrics, grouping = parse_query('avg by (gpu, instance) (rate(X_Y{instance=~"$instance", gpu=~"$gpu"}[5m])) * 1000')
    assert metrics == {"X_Y": [("instance", "=~", "$instance"), ("gpu", "=~", "$gpu")]} and grouping == {"gpu", "instance"}
    assert parse_query("sum(A) / B{x=\"1\"}")[0] == {"A": [], "B": [("x", "=", "1")]}


def test_fixture_has_the_eight_panels():
    titles = [title for title, _expr in panels()]
    assert len(titles) == 8 and "Tensor Core Utilization" in titles


# ---------------------------------------------------------------------- the expositions

def agent_families(install_fake, tmp_path, options: ExpositionOptions | None = None) -> dict:
    """The agent's /metrics: GPU 0 an H100 with GPM and NVLink, GPU 1 an A100 without GPM, two cycles."""
    install_fake([FakeGpu(name="NVIDIA H100 80GB HBM3", uuid="GPU-h100", bus_id="00000000:07:00.0", cc=(9, 0),
                          gpm=True, nvlink_raw_kib=(1000, 2000)),
                  FakeGpu(uuid="GPU-a100", bus_id="00000000:0F:00.0")])
    mon = TelemetryMonitor(state_dir=str(tmp_path), hostname="node-a", watch_xids=False)
    try:
        mon.collect()
        mon.gpm._clock = lambda: 1e9  # the next cycle is "later" without sleeping in the test
        mon.collect()
        registry = CollectorRegistry(auto_describe=True)
        register_collectors(registry, mon, options)
        text = generate_latest(registry).decode()
    finally:
        mon.close()
    return {f.name: f for f in text_string_to_metric_families(text)}


def fleet_families(install_fake, tmp_path) -> tuple[dict, list[str]]:
    """The coordinator's fleet /metrics for two nodes with the same GPU indexes, relabelled as documented."""
    blocks = {}
    for node in ("node-a", "node-b"):
        install_fake([FakeGpu(name="NVIDIA H100 80GB HBM3", uuid=f"GPU-{node}-0", cc=(9, 0), gpm=True),
                      FakeGpu(name="NVIDIA H100 80GB HBM3", uuid=f"GPU-{node}-1", cc=(9, 0), gpm=True)])
        mon = TelemetryMonitor(state_dir=str(tmp_path), hostname=f"host-{node}", watch_xids=False)
        try:
            mon.collect()
            mon.gpm._clock = lambda: 1e9
            mon.collect()
            blocks[node] = json.dumps(mon.telemetry())
        finally:
            mon.close()

    class Fleet:  # what exposition() reads of FleetTelemetry
        _clock = staticmethod(lambda: 2e9)

        def parsed(self):
            for i, (node, raw) in enumerate(blocks.items()):
                yield f"id-{i}", node, json.loads(raw)

    text = fleet_exposition(Fleet()).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    # the documented metric_relabel_configs: {source_labels: [node], regex: "(.+)", target_label: instance}
    for family in families.values():
        for sample in family.samples:
            if family.name != "anex_fleet_nodes_with_telemetry":  # the one fleet-wide series
                assert "node" in sample.labels, (family.name, sample.labels)
                sample.labels["instance"] = sample.labels["node"]
    return families, list(blocks)


def _select(family, matchers: list[tuple[str, str, str]], values: dict[str, str]) -> list:
    def ok(sample) -> bool:
        for label, op, pattern in matchers:
            pattern = re.sub(r"\$(\w+)", lambda m: values[m.group(1)], pattern)  # as Grafana: values are regexes
            have = sample.labels.get(label, "")
            hit = re.fullmatch(pattern, have) is not None if op in ("=~", "!~") else have == pattern
            if hit == (op in ("!~", "!=")):
                return False
        return True

    return [s for s in family.samples if ok(s)]


# ---------------------------------------------------------------------- the checks

def test_every_panel_metric_and_label_exists_on_the_agent(install_fake, tmp_path):
    families = agent_families(install_fake, tmp_path)
    for title, expr in panels():
        metrics, grouping = parse_query(expr)
        assert metrics, (title, expr)
        for name, matchers in metrics.items():
            assert name in families, f"panel {title!r}: {name} is not on the agent's /metrics"
            samples = families[name].samples
            labels = {label for sample in samples for label in sample.labels} | TARGET_LABELS
            for label in {m[0] for m in matchers} | grouping:
                assert label in labels, f"panel {title!r}: {name} has no {label!r} label"
            # data on the GPM-capable GPU for every panel
            assert any(s.labels.get("gpu") == "0" for s in samples), f"panel {title!r}: no data for GPU 0"
    for var, metric, label in variables():
        assert metric in families and (label in TARGET_LABELS or
                                       all(label in s.labels for s in families[metric].samples)), var


def test_every_panel_selects_one_node_on_the_fleet_view(install_fake, tmp_path):
    families, nodes = fleet_families(install_fake, tmp_path)
    for var, metric, label in variables():
        values = {s.labels[label] for s in families[metric].samples}
        assert values == ({*nodes} if label == "instance" else {"0", "1"}), var
    for title, expr in panels():
        metrics, grouping = parse_query(expr)
        for name, matchers in metrics.items():
            assert name in families, f"panel {title!r}: {name} is not on the fleet /metrics"
            family = families[name]
            for label in grouping:
                assert all(label in s.labels for s in family.samples), (title, label)
            for node in nodes:
                # one node, all its GPUs ($gpu = All): what avg()/sum() panels aggregate
                chosen = _select(family, matchers, {"instance": re.escape(node), "gpu": ".*"})
                assert {s.labels["node"] for s in chosen} == {node}, (title, node)
                assert sorted(s.labels["gpu"] for s in chosen) == ["0", "1"], (title, node)
                for gpu in ("0", "1"):  # one node, one GPU: one series, never the other node's GPU of that index
                    assert len(_select(family, matchers, {"instance": re.escape(node), "gpu": gpu})) == 1, (title, node, gpu)


def test_tensor_core_panel_has_data_only_where_gpm_measures_it(install_fake, tmp_path):
    families = agent_families(install_fake, tmp_path)
    tensor = {s.labels["gpu"]: s.value for s in families["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"].samples}
    assert tensor == {"0": pytest.approx(0.42)}  # NVML's 42 % as DCGM's ratio; nothing made up for the A100


def test_default_counters_of_dcgm_exporter_are_exposed(install_fake, tmp_path):
    """Every field dcgm-exporter enables by default, on the GPU that has it (GPM + NVLink: the H100)."""
    families = agent_families(install_fake, tmp_path)
    enabled = []
    for line in (FIXTURES / "default-counters.csv").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, kind = (part.strip() for part in line.split(",")[:2])
            enabled.append((name, kind))
    not_ours = {"DCGM_FI_DEV_VGPU_LICENSE_STATUS", "DCGM_FI_DRIVER_VERSION"}  # vGPU guests; a label (in anex_gpu_info)
    for name, _kind in enabled:
        if name in not_ours:
            continue
        assert name in families, name
        assert any(s.labels["gpu"] == "0" for s in families[name].samples), name


@pytest.mark.parametrize("host_label", ["hostname", "Hostname"])
def test_host_label_spelling_follows_the_option(install_fake, tmp_path, host_label):
    families = agent_families(install_fake, tmp_path, ExpositionOptions(host_label=host_label))
    other = {"hostname": "Hostname", "Hostname": "hostname"}[host_label]
    for name in ("DCGM_FI_DEV_GPU_TEMP", "anex_nvml_up"):
        for sample in families[name].samples:
            assert sample.labels[host_label] == "node-a" and other not in sample.labels
