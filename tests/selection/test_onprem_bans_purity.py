"""On-prem adapter, in-memory bans, and the purity of the selection cores."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from anex_agent.selection.annotations import parse_annotations
from anex_agent.selection.bans import MemoryBans
from anex_agent.providers.onprem import OnpremSource, offer_from_node
from tests.selection.test_api import telemetry

PURE = ["annotations", "filters", "rank", "offers", "regions", "units", "versions", "labels", "qualification",
        "jsonpieces"]


@pytest.mark.parametrize("module", PURE)
def test_cores_import_no_asyncio_socket_or_time(module):
    source = Path(__file__).resolve().parents[2] / "anex_agent" / "selection" / f"{module}.py"
    imported = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & {"asyncio", "socket", "time", "aiohttp"}


REQUIRED = {"qualification": "required"}  # the rules required of all systems (CloudBender's list)


def node(**changes):
    base = {"id": "n1", "name": "dgx", "provider": "onprem", "state": "ready", "health": "healthy",
            "labels": {"price-per-hour": "0.5", "country": "cz"}, "telemetry": telemetry()}
    return {**base, **changes}


def test_node_to_offer_units():
    offer, reason = offer_from_node(node())
    assert reason == ""
    assert (offer.gpu_name, offer.gpu_count, offer.vram_mb, offer.vram_total_mb) == ("NVIDIA GeForce RTX 4090", 2.0,
                                                                                    24576.0, 49152.0)
    assert (offer.compute_cap, offer.cpu_cores, offer.ram_mb, offer.disk_gb) == (890, 32.0, 131072.0, 900.0)
    assert (offer.price, offer.country, offer.machine_id, offer.vram_bw_gbps) == (0.5, "CZ", "n1", 1008.1)
    assert offer.gpu_key == "rtx 4090"


@pytest.mark.parametrize("changes,reason", [
    ({"state": "not_ready"}, "not 'ready'"),
    ({"health": "degraded"}, "not healthy"),
    ({"labels": {"country": "CZ"}}, "price-per-hour"),
    ({"labels": {"price-per-hour": "cheap"}}, "price-per-hour"),
    ({"labels": {"price-per-hour": "0.5", "busy": "true"}}, "busy"),
    ({"telemetry": telemetry(processes=True)}, "busy"),
    ({"telemetry": telemetry(passed=False), "labels": {**REQUIRED, "price-per-hour": "0.5"}}, "qualification"),
    ({"telemetry": {**telemetry(), "qualification": None}, "labels": {**REQUIRED, "price-per-hour": "0.5"}},
     "qualification"),
    ({"labels": {"price-per-hour": "0.5", "maintenance": "TRUE"}}, "in maintenance"),
    ({"telemetry": {**telemetry(), "nvml": {"state": "driver_not_loaded"}}}, "rule driver_loaded failed"),
    ({"labels": {"price-per-hour": "0.5", "qualification": "strictest"}}, "label qualification='strictest'"),
    ({"telemetry": telemetry(verdict="degraded")}, "not healthy"),
    ({"telemetry": telemetry(count=0)}, "no GPUs"),
    ({"provider": "vastai"}, "not an on-prem node"),
])
def test_unavailable_nodes_say_why(changes, reason):
    offer, why = offer_from_node(node(**changes))
    assert offer is None and reason in why


def test_mixed_gpu_models_are_refused():
    t = telemetry()
    t["inventory"]["gpus"][1] = {**t["inventory"]["gpus"][1], "name": "NVIDIA A100-SXM4-80GB"}
    offer, why = offer_from_node(node(telemetry=t))
    assert offer is None and "more than one model" in why


async def test_onprem_source_reports_skipped_nodes():
    async def lister():
        return [node(), node(id="n2", state="pending"), node(id="x", provider="runpod")]

    source = OnpremSource(lister)
    table = await source.offers(parse_annotations({}))
    assert [o.offer_id for o in table.offers] == ["n1"]
    assert set(source.skipped) == {"n2"}


async def test_memory_bans_expire_and_extend():
    now = [100.0]
    bans = MemoryBans(clock=lambda: now[0])
    await bans.ban("m1", "failed", 60)
    await bans.ban("m1", "failed again", 10)  # a shorter re-ban never shortens the ban
    assert [b.expires_at for b in await bans.active()] == [160.0]
    now[0] = 161.0
    assert await bans.banned_machines() == frozenset()


def test_adapter_reads_the_telemetry_the_gpu_module_builds():
    """Contract with anex_agent.gpu: a block made by its real builder becomes the expected offer."""
    from anex_agent.gpu.health import Verdict
    from anex_agent.gpu.inventory import GpuInfo, NodeInventory
    from anex_agent.gpu.monitor import Snapshot
    from anex_agent.gpu.nvml import NvmlState, NvmlStatus
    from anex_agent.gpu.qualify import Check, Qualification
    from anex_agent.gpu.telemetry import build_telemetry

    gpus = tuple(GpuInfo(index=i, name="NVIDIA A100-SXM4-80GB", uuid=f"GPU-{i}", pci_bus_id=f"0000:0{i}:00.0",
                         memory_total_bytes=80 * 2**30, compute_capability="8.0", memory_bandwidth_gbps=2039.0)
                 for i in range(4))
    snapshot = Snapshot(taken_at=1.0, hostname="dgx", nvml=NvmlStatus(NvmlState.ok),
                        inventory=NodeInventory(driver_version="550.54.15", cuda_version="12.4", gpus=gpus),
                        samples={}, gpu_failures={}, verdict=Verdict(),
                        host={"cpu_count": 64, "mem_total_bytes": 1024 * 2**30, "disk": {"free_bytes": 7 * 2**40}})
    checks = (Check("gpu_model", "required", "pass", "1 model", "1 model"),
              Check("memory", "marketplace", "fail", "1 TiB", "640 GiB"))
    block = build_telemetry(snapshot, qualification=Qualification(checks).to_dict())
    offer, why = offer_from_node(node(telemetry=block))
    assert why == ""
    assert (offer.gpu_name, offer.gpu_count, offer.vram_mb, offer.compute_cap) == ("NVIDIA A100-SXM4-80GB", 4.0,
                                                                                   81920.0, 800)
    assert (offer.cuda, offer.cpu_cores, offer.ram_mb, offer.vram_bw_gbps) == (12004000.0, 64.0, 1048576.0, 2039.0)
    failed = Qualification((Check("tpm", "required", "fail", "none", "2.0"),)).to_dict()
    failing = node(telemetry=build_telemetry(snapshot, qualification=failed))
    offer, why = offer_from_node(failing)  # default policy: runnable; the TPM does not decide whether a job runs
    assert why == "" and offer is not None
    offer, why = offer_from_node(failing, "required")  # the coordinator's default
    assert offer is None and why == "qualification policy 'required': rule tpm failed (measured none, required 2.0)"
    offer, why = offer_from_node({**failing, "labels": {**failing["labels"], **REQUIRED}})  # per node / per token
    assert offer is None and "rule tpm failed" in why
    offer, why = offer_from_node(node(telemetry=block), "full")  # memory is a marketplace rule
    assert offer is None and why.startswith("qualification policy 'full': rule memory failed")
    offer, why = offer_from_node(node(telemetry=block), "gpu_model")  # a policy of rule ids
    assert why == ""


def _malformed_telemetries():
    t = telemetry()
    yield {**t, "health": "healthy"}  # not an object
    yield {**t, "inventory": ["not", "an", "object"]}
    yield {**t, "host": "big"}
    yield {**t, "gpus": [3]}
    bad_cap = telemetry()
    bad_cap["inventory"]["gpus"] = [{**g, "compute_capability": "eight"} for g in bad_cap["inventory"]["gpus"]]
    yield bad_cap


@pytest.mark.parametrize("bad", list(_malformed_telemetries()))
async def test_a_node_with_malformed_telemetry_is_skipped_not_a_crash(bad):
    """Telemetry is whatever a node sent: one odd payload must not fail the selection for everyone."""
    async def lister():
        return [node(), node(id="n2", telemetry=bad)]

    source = OnpremSource(lister)
    table = await source.offers(parse_annotations({}))
    offered = [o.offer_id for o in table.offers]
    assert "n1" in offered
    if "n2" not in offered:
        assert "telemetry" in source.skipped["n2"]


def test_default_policy_offers_a_server_without_tpm_or_nvme():
    """Most servers have no TPM 2.0 or second NVMe drive: by default they are still offered."""
    t = telemetry(passed=False)
    t["qualification"]["checks"] = [
        {"id": "gpu_model", "scope": "required", "status": "pass", "measured": "2 x RTX 4090", "required": "1 model"},
        {"id": "nvme_drives", "scope": "required", "status": "fail", "measured": "1", "required": ">= 2"},
        {"id": "tpm", "scope": "required", "status": "not_checked", "measured": "-", "required": "TPM 2.0",
         "detail": "not checked: no access"}]
    offer, why = offer_from_node(node(telemetry=t))
    assert why == "" and offer.offer_id == "n1"
    offer, why = offer_from_node(node(telemetry=t, labels={**REQUIRED, "price-per-hour": "0.5"}))
    assert offer is None and why == ("qualification policy 'required': rule nvme_drives failed "
                                     "(measured 1, required >= 2)")
    offer, why = offer_from_node(node(telemetry=t, labels={"qualification": "tpm", "price-per-hour": "0.5"}))
    assert offer is None and "rule tpm not checked" in why and "no access" in why


def test_maintenance_wins_over_everything():
    offer, why = offer_from_node(node(state="not_ready", labels={"maintenance": "true", "price-per-hour": "0.1"}))
    assert offer is None and why == "in maintenance (label maintenance=true)"
    offer, why = offer_from_node(node(labels={"maintenance": "false", "price-per-hour": "0.1"}))
    assert why == "" and offer is not None
