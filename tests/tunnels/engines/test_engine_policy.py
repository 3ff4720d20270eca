"""The agent's engine policy: auto skips engines that cannot serve the workload, with the reason."""

from __future__ import annotations

import pytest

from anex_agent.errors import ConfigError, EngineError
from anex_agent.tunnels.engines import base, detect, registry
from anex_agent.tunnels.engines.status import Support


def fake_engine(name: str, runs: bool, serves: bool):
    class Fake(base.Engine):
        @classmethod
        def is_supported(cls):
            return Support(runs, f"{name} runs" if runs else f"{name} cannot run here")

        @classmethod
        def workload_support(cls):
            return Support(serves, f"{name} serves" if serves else f"{name} has no stack")

        async def start(self): ...
        async def apply(self, desired): ...
        async def status(self): ...
        async def stop(self): ...
        def dialer(self, resolver=None): ...

    Fake.name = name
    return Fake


@pytest.fixture
def engines(monkeypatch):
    """Install fake engine classes: set(name=(runs, serves), ...)."""
    def install(**spec):
        classes = {n: fake_engine(n, *spec[n]) for n in registry.AUTO_ORDER if n in spec}
        monkeypatch.setattr(registry, "engine_classes", lambda: classes)
        monkeypatch.setattr(detect, "engine_classes", lambda: classes)
        return classes
    return install


def test_auto_order_puts_userspace_before_wireproxy():
    assert registry.AUTO_ORDER == ("kernel", "wireguard-go", "userspace", "wireproxy")


def test_real_classes_answer_workload_support():
    classes = registry.engine_classes()
    assert classes["kernel"].workload_support().ok and classes["wireguard-go"].workload_support().ok
    assert classes["wireproxy"].workload_support().ok and classes["wireproxy"].frontends == "engine"
    userspace = classes["userspace"].workload_support()
    assert userspace.ok and "TCP/IP stack" in userspace.reason
    assert classes["userspace"].host_address is False and classes["wireproxy"].host_address is False


def test_auto_for_workload_skips_userspace_and_says_why(engines):
    engines(kernel=(False, True), **{"wireguard-go": (False, True), "wireproxy": (False, True), "userspace": (True, False)})
    with pytest.raises(EngineError) as err:
        registry.choose_engine("auto", for_workload=True)
    assert "userspace: runs here but cannot serve the workload: userspace has no stack" in str(err.value)


def test_auto_for_workload_takes_wireproxy_when_it_runs(engines):
    classes = engines(kernel=(False, True), **{"wireguard-go": (False, True), "wireproxy": (True, True), "userspace": (True, False)})
    cls, tried = registry.choose_engine("auto", for_workload=True)
    assert cls is classes["wireproxy"]
    assert list(tried) == ["kernel", "wireguard-go", "userspace", "wireproxy"]


def test_auto_for_workload_prefers_native_engines(engines):
    classes = engines(kernel=(False, True), **{"wireguard-go": (True, True), "wireproxy": (True, True), "userspace": (True, True)})
    assert registry.choose_engine("auto", for_workload=True)[0] is classes["wireguard-go"]


def test_userspace_with_a_stack_is_picked_when_native_engines_cannot_run(engines):
    classes = engines(kernel=(False, True), **{"wireguard-go": (False, True), "wireproxy": (True, True), "userspace": (True, True)})
    cls, tried = registry.choose_engine("auto", for_workload=True)
    assert cls is classes["userspace"]
    assert list(tried) == ["kernel", "wireguard-go", "userspace"]  # wireproxy's binary is not even probed


def test_tunnel_only_purpose_keeps_plain_support(engines):
    classes = engines(kernel=(False, True), **{"wireguard-go": (False, True), "wireproxy": (False, True), "userspace": (True, False)})
    assert registry.choose_engine("auto")[0] is classes["userspace"]  # e.g. the interop tests drive it directly


def test_tunnel_only_auto_never_picks_an_engine_that_serves_a_workload_only(engines):
    classes = engines(kernel=(False, True), **{"wireguard-go": (False, True), "wireproxy": (True, True), "userspace": (False, False)})
    classes["wireproxy"].frontends = "engine"
    with pytest.raises(EngineError) as err:  # e.g. the gateway's hub: wireproxy runs, but is never its tunnel
        registry.choose_engine("auto")
    assert "wireproxy: serves a node's workload only" in str(err.value)


def test_explicit_engine_that_cannot_serve_names_the_variable_and_the_choices(engines):
    engines(kernel=(False, True), **{"wireguard-go": (True, True), "wireproxy": (False, True), "userspace": (True, False)})
    with pytest.raises(ConfigError) as err:
        registry.choose_engine("userspace", for_workload=True, source="ANEX_ENGINE")
    text = str(err.value)
    assert err.value.source == "ANEX_ENGINE"
    assert text.startswith("ANEX_ENGINE: 'userspace' cannot serve the workload yet (userspace has no stack)")
    assert "accepted: auto, kernel, wireguard-go, wireproxy" in text
    assert "usable on this machine: wireguard-go" in text
    assert "\n" not in text


def test_detect_auto_follows_the_workload_policy(engines):
    engines(kernel=(False, True), **{"wireguard-go": (False, True), "wireproxy": (False, True), "userspace": (True, False)})
    doc = detect.detect().to_dict()
    assert doc["auto"] is None
    assert doc["engines"]["userspace"] == {"supported": True, "reason": "userspace runs", "serves_workload": False,
                                           "workload_reason": "userspace has no stack"}
    assert doc["auto_skipped"] == {"userspace": "runs here but cannot serve the workload: userspace has no stack"}
    assert "userspace" in doc["capabilities"]  # it can still run (e.g. for packet-level use)


def test_detect_auto_picks_userspace_over_wireproxy(engines):
    engines(kernel=(False, True), **{"wireguard-go": (False, True), "wireproxy": (True, True), "userspace": (True, True)})
    assert detect.detect().to_dict()["auto"] == "userspace"


def test_detect_auto_picks_wireproxy_over_a_userspace_that_cannot_serve(engines):
    engines(kernel=(False, True), **{"wireguard-go": (False, True), "wireproxy": (True, True), "userspace": (True, False)})
    assert detect.detect().to_dict()["auto"] == "wireproxy"


async def test_send_keepalive_default_sends_nothing():
    """The contract's default: an engine that cannot send a WireGuard keepalive sends nothing (no
    datagram through its interface instead: WireGuard takes that for data, and data that gets no
    answer makes it start a new handshake 15 s later)."""
    assert await fake_engine("os-interface", True, True)().send_keepalive(["gateway-key"]) is False
