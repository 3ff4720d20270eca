"""Engine choice: the registry in auto order, the first supported engine, and why none or the named one cannot run."""

from __future__ import annotations

import pytest

from anex_agent.errors import ConfigError, EngineError
from anex_agent.tunnels.engines import registry
from anex_agent.tunnels.engines.status import Support


def test_registry_lists_kernel_and_wireguard_go_in_auto_order():
    classes = registry.engine_classes()
    assert list(classes)[:2] == ["kernel", "wireguard-go"]
    assert [n for n in registry.AUTO_ORDER if n in classes] == list(classes)
    for name, cls in classes.items():
        assert cls.name == name


def _fake(name, ok):
    return type(f"Fake{name}", (), {"name": name, "is_supported": classmethod(lambda cls: Support(ok, f"{name} says {ok}"))})


def test_choose_engine_takes_first_supported(monkeypatch):
    monkeypatch.setattr(registry, "engine_classes", lambda: {"kernel": _fake("kernel", False), "wireguard-go": _fake("wireguard-go", True)})
    cls, tried = registry.choose_engine("auto")
    assert cls.name == "wireguard-go"
    assert tried["kernel"] == Support(False, "kernel says False")


def test_choose_engine_explains_failure(monkeypatch):
    monkeypatch.setattr(registry, "engine_classes", lambda: {"kernel": _fake("kernel", False)})
    with pytest.raises(EngineError, match="kernel says False"):
        registry.choose_engine("auto")
    with pytest.raises(ConfigError, match="not available in this build"):
        registry.choose_engine("wireproxy", source="ANEX_ENGINE")
    with pytest.raises(ConfigError, match="engine"):
        registry.choose_engine("magic")


def test_a_named_engine_that_cannot_run_here_names_the_setting_why_and_what_runs(monkeypatch):
    """ANEX_ENGINE=kernel without the module or CAP_NET_ADMIN: one line naming the variable (exit 2), not exit 1."""
    fakes = {"kernel": _fake("kernel", False), "wireguard-go": _fake("wireguard-go", True)}
    monkeypatch.setattr(registry, "engine_classes", lambda: fakes)
    with pytest.raises(ConfigError) as err:
        registry.choose_engine("kernel", source="ANEX_ENGINE")
    assert err.value.source == "ANEX_ENGINE"
    assert str(err.value) == ("ANEX_ENGINE: 'kernel': the kernel engine cannot run here (kernel says False); "
                              "engines that run here: wireguard-go, or auto (leave it unset) to pick one")
    fakes["wireguard-go"] = _fake("wireguard-go", False)
    with pytest.raises(ConfigError, match="engines that run here: none, or auto"):
        registry.choose_engine("kernel", source="--engine")
