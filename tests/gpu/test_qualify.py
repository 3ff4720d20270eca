"""Qualification rules with made-up servers, sysfs readers on a made-up tree, and the real CLI here."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from anex_agent.gpu.inventory import GpuInfo
from anex_agent.gpu.nvml import OK, NvmlState, NvmlStatus
from anex_agent.gpu.qualify import TB, NvmeDrive, ServerFacts, evaluate, read_nvme, read_tpm
from anex_agent.gpu.qualify_cli import render_table

GIB = 1024**3


def gpu(index, name="NVIDIA A100-PCIE-40GB", vram_gib=40, width=16, gen=4):
    return GpuInfo(index=index, name=name, uuid=f"GPU-{index}", pci_bus_id=f"0:{index}:0",
                   memory_total_bytes=vram_gib * GIB, pcie_width=width, pcie_max_gen=gen, pcie_max_width=16,
                   form_factor="sxm" if "SXM" in name else "pcie")


GOOD = ServerFacts(
    nvml=OK,
    gpus=tuple(gpu(i) for i in range(4)),
    mem_total_bytes=320 * GIB,
    cpu_physical=16,
    cpu_logical=32,
    nvme=(NvmeDrive("nvme0", "Samsung", 2 * TB), NvmeDrive("nvme1", "Samsung", 2 * TB)),
    tpm_version=2,
)


def statuses(facts):
    return {c.id: c.status for c in evaluate(facts).checks}


def test_good_server_passes_every_rule():
    result = evaluate(GOOD)
    assert result.status == "pass"
    assert set(statuses(GOOD).values()) == {"pass"}
    assert result.to_dict()["required_ok"] is True and result.to_dict()["marketplace_ok"] is True


@pytest.mark.parametrize(("change", "rule"), [
    ({"gpus": (gpu(0), gpu(1, name="NVIDIA RTX A6000"))}, "gpu_model"),
    ({"gpus": ()}, "gpu_model"),
    ({"nvme": (NvmeDrive("nvme0", "x", 4 * TB),)}, "nvme_drives"),
    ({"nvme": (NvmeDrive("nvme0", "x", TB // 2), NvmeDrive("nvme1", "x", TB))}, "nvme_capacity"),  # 4 GPUs need 2 TB
    ({"tpm_version": 1}, "tpm"),
    ({"tpm_version": None, "tpm_note": "no TPM device in /sys/class/tpm"}, "tpm"),
    ({"mem_total_bytes": 300 * GIB}, "memory"),  # 4 x 40 GiB VRAM needs 320 GiB; 3 % tolerance is 310.4
    ({"gpus": tuple(gpu(i, width=8 if i else 4) for i in range(4))}, "pcie_lanes"),
    ({"cpu_physical": 15}, "cpu_cores"),  # 4 x PCIe 4.0 GPUs need 16 cores
])
def test_each_rule_fails_on_its_own(change, rule):
    facts = replace(GOOD, **change)
    result = statuses(facts)
    assert result[rule] == "fail"
    assert evaluate(facts).status == "fail"
    others = {k: v for k, v in result.items() if k != rule and not (rule == "gpu_model" and k in ("pcie_lanes",))}
    assert set(others.values()) <= {"pass"}, others


def test_boundaries():
    assert statuses(replace(GOOD, mem_total_bytes=int(320 * GIB * 0.975)))["memory"] == "pass"  # MemTotal < DIMMs
    assert statuses(replace(GOOD, cpu_physical=8, gpus=tuple(gpu(i, gen=3) for i in range(4))))["cpu_cores"] == "pass"
    assert statuses(replace(GOOD, gpus=(gpu(0), gpu(1)), nvme=(NvmeDrive("a", "", TB), NvmeDrive("b", "", 0))))[
        "nvme_capacity"] == "pass"  # 1 TB for 2 GPUs
    three = replace(GOOD, gpus=tuple(gpu(i) for i in range(3)), nvme=(NvmeDrive("a", "", TB), NvmeDrive("b", "", TB // 2)))
    assert statuses(three)["nvme_capacity"] == "fail"  # 3 GPUs need 2 TB


def test_sxm_gpus_are_exempt_from_the_lanes_rule():
    sxm = replace(GOOD, gpus=tuple(gpu(i, name="NVIDIA A100-SXM4-40GB", width=4) for i in range(4)))
    assert statuses(sxm)["pcie_lanes"] == "pass"
    assert statuses(replace(sxm, form_factor="pcie"))["pcie_lanes"] == "fail"  # --form-factor pcie overrides


def test_without_driver_the_gpu_rules_are_not_checked_and_say_why():
    facts = replace(GOOD, gpus=None, nvml=NvmlStatus(NvmlState.no_driver, "no NVIDIA driver: the NVML library "
                                                                        "libnvidia-ml.so.1 was not found", 12))
    result = evaluate(facts)
    checks = {c.id: c for c in result.checks}
    for rule in ("gpu_model", "nvme_capacity", "memory", "pcie_lanes", "cpu_cores"):
        assert checks[rule].status == "not_checked"
        assert checks[rule].detail.startswith("not checked: no NVIDIA driver")
    assert checks["nvme_drives"].status == "pass" and checks["tpm"].status == "pass"
    assert result.status == "incomplete"
    assert result.to_dict()["required_ok"] is None
    table = render_table(result.to_dict())
    assert "INCOMPLETE" in table and "n/a" in table


def test_sysfs_readers(tmp_path):
    sysfs = tmp_path
    for ctrl, ns_sizes in (("nvme0", [1_953_525_168]), ("nvme1", [976_773_168, 1000])):
        (sysfs / "class" / "nvme" / ctrl).mkdir(parents=True)
        (sysfs / "class" / "nvme" / ctrl / "model").write_text("ACME SSD   \n")
        for n, sectors in enumerate(ns_sizes, start=1):
            (sysfs / "block" / f"{ctrl}n{n}").mkdir(parents=True)
            (sysfs / "block" / f"{ctrl}n{n}" / "size").write_text(f"{sectors}\n")
    (sysfs / "block" / "sda").mkdir()
    drives = read_nvme(str(sysfs))
    assert [(d.name, d.model) for d in drives] == [("nvme0", "ACME SSD"), ("nvme1", "ACME SSD")]
    assert drives[0].size_bytes == 1_953_525_168 * 512 and drives[1].size_bytes == (976_773_168 + 1000) * 512
    assert read_tpm(str(sysfs)) == (None, "no TPM device in /sys/class/tpm (enable the TPM or fTPM in the firmware)")
    (sysfs / "class" / "tpm" / "tpm0").mkdir(parents=True)
    assert read_tpm(str(sysfs))[1].startswith("not checked")
    (sysfs / "class" / "tpm" / "tpm0" / "tpm_version_major").write_text("2\n")
    assert read_tpm(str(sysfs)) == (2, "tpm0")
    assert read_nvme(str(tmp_path / "missing")) is None


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "anex_agent", "qualify", *args], capture_output=True, text=True,
                          timeout=60)


def test_real_cli_json_on_this_machine():
    proc = run_cli("--json")
    result = json.loads(proc.stdout)
    expected_rc = {"pass": 0, "fail": 1, "incomplete": 3}[result["status"]]
    assert proc.returncode == expected_rc, proc.stderr
    checks = {c["id"]: c for c in result["checks"]}
    assert set(checks) == {"gpu_model", "nvme_drives", "nvme_capacity", "tpm", "memory", "pcie_lanes", "cpu_cores"}
    if result["summary"]["nvml"]["state"] != "ok":  # no GPU here: the GPU rules say why they were not checked
        assert checks["gpu_model"]["status"] == "not_checked"
        assert checks["memory"]["detail"].startswith("not checked: ")
    assert result["summary"]["mem_total_bytes"] > 0


def test_real_cli_table_and_bad_flag():
    proc = run_cli()
    assert proc.returncode in (0, 1, 3)
    assert "rule" in proc.stdout and "gpu_model" in proc.stdout
    assert run_cli("--form-factor", "oval").returncode == 2


def test_the_rules_telemetry_names_are_the_rules_applied():
    """Selection (on the coordinator, which imports nothing of anex_agent.gpu) reads the rule ids
    and scopes from anex_agent.telemetry.models: they must be the ones evaluate() applies, in order."""
    from anex_agent.gpu.qualify import RULES
    from anex_agent.telemetry.models import QUALIFICATION_RULES

    assert tuple((rule.id, rule.scope) for rule in RULES) == QUALIFICATION_RULES
