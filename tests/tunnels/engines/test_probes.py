"""Capability probes, the detect report, cleanup's name matching, endpoint helpers."""

from __future__ import annotations

import asyncio
import json

import pytest

from anex_agent.tunnels.engines import cleanup, detect, endpoints
from anex_agent.tunnels.os import caps, netconf
from anex_agent.tunnels.engines.status import Support

STATUS = "Name:\tpython\nCapInh:\t0000000000000000\nCapEff:\t{}\nCapBnd:\t000001ffffffffff\n"


@pytest.mark.parametrize("mask, expected", [("000001ffffffffff", True), ("0000000000000000", False), ("0000000000001000", True),
                                            ("0000000000000fff", False)])
def test_cap_net_admin_from_status(tmp_path, mask, expected):
    path = tmp_path / "status"
    path.write_text(STATUS.format(mask))
    assert caps.has_capability(caps.CAP_NET_ADMIN, str(path)) is expected


def test_capeff_missing_means_no():
    assert caps.parse_capeff("Name: x\n") is None
    assert caps.has_capability(caps.CAP_NET_ADMIN, "/nonexistent/status") is False


def test_tun_missing_reason(tmp_path):
    ok, why = caps.tun_usable(str(tmp_path / "tun"))
    assert not ok and "does not exist" in why


def test_wireguard_go_unsupported_without_binary():
    from anex_agent.tunnels.engines.wireguard_go import WireguardGoEngine

    support = WireguardGoEngine.is_supported(binary="wireguard-go-not-installed")
    assert support == Support(False, "wireguard-go-not-installed not found on PATH (install the wireguard-go package)")


def test_detect_report_shape():
    report = detect.detect()
    doc = json.loads(json.dumps(report.to_dict()))
    assert list(doc["engines"]) == ["kernel", "wireguard-go", "userspace", "wireproxy"]
    for entry in doc["engines"].values():
        assert set(entry) == {"supported", "reason", "serves_workload", "workload_reason"}
        assert isinstance(entry["reason"], str) and entry["reason"] and entry["workload_reason"]
    assert doc["auto"] in (None, *doc["engines"])
    if doc["auto"]:
        assert doc["engines"][doc["auto"]]["supported"] and doc["engines"][doc["auto"]]["serves_workload"]
    assert doc["auto"] in ("kernel", "wireguard-go", "userspace")  # userspace always runs and serves
    assert doc["engines"]["userspace"]["supported"] and doc["engines"]["userspace"]["serves_workload"]
    assert "userspace" not in doc["auto_skipped"]
    assert set(doc["udp"]) == {"supported", "reason"}
    assert all(c in ("kernel-wireguard", "wireguard-go", "userspace", "wireproxy", "udp") for c in doc["capabilities"])


def test_detect_capabilities_follow_support():
    report = detect.DetectReport(engines={"kernel": Support(False, "no"), "wireguard-go": Support(True, "yes")},
                                 udp=Support(True, "ok"), auto="wireguard-go")
    assert report.capabilities == ["wireguard-go", "udp"]


def test_probe_that_raises_is_reported():
    class Broken:
        @classmethod
        def is_supported(cls):
            raise RuntimeError("boom")

    assert detect.probe_engine(Broken) == Support(False, "probe failed: RuntimeError: boom")


def test_udp_probe_to_loopback_and_bad_target():
    assert detect.probe_udp("127.0.0.1:9").ok
    bad = detect.probe_udp("not-a-target")
    assert not bad.ok and "not-a-target" in bad.reason


@pytest.mark.parametrize(
    "argv, expected",
    [(["wireguard-go", "-f", "anxgw1"], "anxgw1"), (["/usr/bin/wireguard-go", "anxn1"], "anxn1"),
     (["python", "x"], None), ([], None), (["wireguard-go", "-f"], None)],
)
def test_cleanup_recognises_wireguard_go(argv, expected):
    assert cleanup.wireguard_go_ifname(argv) == expected


def test_plan_set():
    plan = netconf.plan_set(["10.0.0.1/24", "10.9.0.1/16"], ["10.0.0.1/24", "10.1.0.1/24"], kind="interface")
    assert plan.add == ("10.1.0.1/24",) and plan.remove == ("10.9.0.1/16",)
    routes = netconf.plan_set(["10.96.0.0/12"], ["10.96.1.1/12", "192.168.0.0/16"])
    assert routes.add == ("192.168.0.0/16",) and routes.remove == ()


def test_endpoint_helpers():
    assert netconf.split_host_port("[fd00::1]:51820") == ("fd00::1", 51820)
    assert netconf.join_host_port("fd00::1", 1) == "[fd00::1]:1"
    with pytest.raises(ValueError):
        netconf.split_host_port("host")
    for odd in ("gw:²", "gw:٥١٨٢٠", "gw:５", "gw:0", "fd00::1:51820"):
        with pytest.raises(ValueError, match=f"endpoint {odd!r} must be HOST:PORT"):
            netconf.split_host_port(odd)
    assert asyncio.run(endpoints.resolve_endpoint("localhost:51820")) in ("127.0.0.1:51820", "[::1]:51820")
    assert asyncio.run(endpoints.resolve_endpoint("192.0.2.1:5")) == "192.0.2.1:5"
