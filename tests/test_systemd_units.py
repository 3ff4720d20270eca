"""The systemd units: verified by ``systemd-analyze verify`` against the installed binary,
and the properties they promise (notify, watchdog, restart, hardening) are there."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parents[1] / "systemd"
INSTALLED = "/usr/local/bin/anex-agent"  # where the units expect the binary; swapped for this install's
ANALYZE = shutil.which("systemd-analyze")


def _binary() -> str:
    found = shutil.which("anex-agent") or str(Path(sys.executable).parent / "anex-agent")
    if not Path(found).exists():
        pytest.skip("the anex-agent console script is not installed (pip install -e .)")
    return found


def _verify(tmp_path: Path, name: str, text: str) -> subprocess.CompletedProcess:
    (tmp_path / name).write_text(text.replace(INSTALLED, _binary()))
    return subprocess.run([ANALYZE, "verify", str(tmp_path / name)], capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed (scripts/install-deps installs systemd)")
@pytest.mark.parametrize("unit", ["anex-agent.service", "anex-gateway.service", "anex-coordinator.service"])
def test_unit_verifies_cleanly(tmp_path, unit):
    result = _verify(tmp_path, unit, (UNITS / unit).read_text())
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), result.stderr


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed")
def test_verify_catches_a_broken_unit(tmp_path):
    broken = (UNITS / "anex-agent.service").read_text().replace("Type=notify", "Type=notfy")
    assert "notfy" in _verify(tmp_path, "anex-agent.service", broken).stderr
    missing = (UNITS / "anex-agent.service").read_text().replace(INSTALLED, "/nonexistent/anex-agent")
    (tmp_path / "m.service").write_text(missing)
    result = subprocess.run([ANALYZE, "verify", str(tmp_path / "m.service")], capture_output=True, text=True)
    assert result.returncode != 0


def _service(unit: str) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for line in (UNITS / unit).read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            values.setdefault(key.strip(), []).append(value.strip())
    return values


@pytest.mark.parametrize("unit", ["anex-agent.service", "anex-gateway.service", "anex-coordinator.service"])
def test_notify_watchdog_restart_and_hardening(unit):
    s = _service(unit)
    assert s["Type"] == ["notify"] and s["NotifyAccess"] == ["main"] and s["WatchdogSec"] == ["30s"]
    assert s["Restart"] == ["on-failure"] and s["StateDirectory"]
    for key, value in (("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("ProtectHome", "yes"),
                       ("PrivateTmp", "yes"), ("ProtectKernelModules", "yes"), ("RestrictSUIDSGID", "yes")):
        assert s.get(key) == [value], (unit, key)
    assert "CapabilityBoundingSet" in s and "SystemCallFilter" in s


def test_capabilities_are_only_what_the_role_needs():
    assert _service("anex-agent.service")["CapabilityBoundingSet"] == ["CAP_NET_ADMIN"]
    assert _service("anex-agent.service")["ExecStopPost"] == [f"{INSTALLED} cleanup"]
    assert _service("anex-gateway.service")["CapabilityBoundingSet"] == ["CAP_NET_ADMIN CAP_NET_BIND_SERVICE CAP_NET_RAW"]
    assert _service("anex-coordinator.service")["CapabilityBoundingSet"] == [""]
