"""Fixtures: the fake pynvml module installed at the ``pynvml`` import boundary."""

from __future__ import annotations

import sys
from typing import Callable

import pytest

from anex_agent.testing.fake_nvml import FakeGpu, FakeNvml


@pytest.fixture
def install_fake(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeNvml]:
    """Return a factory: ``install_fake([FakeGpu(...), ...])`` puts a fake pynvml in sys.modules."""

    def install(gpus: list[FakeGpu] | None = None, **kwargs) -> FakeNvml:
        fake = FakeNvml(gpus, **kwargs)
        monkeypatch.setitem(sys.modules, "pynvml", fake.module)
        return fake

    return install


@pytest.fixture
def fake(install_fake) -> FakeNvml:
    """Two identical healthy A100s."""
    return install_fake([FakeGpu(uuid="GPU-aaaa", bus_id="00000000:07:00.0"),
                         FakeGpu(uuid="GPU-bbbb", bus_id="00000000:0F:00.0")])
