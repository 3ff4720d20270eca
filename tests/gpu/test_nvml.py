"""NVML init, error classification and state logging: the real no-driver path and each error class via the fake."""

from __future__ import annotations

import ctypes
import logging
import sys

import pynvml as real_pynvml
import pytest

from anex_agent.gpu.nvml import ABSENT, DeviceFailure, Nvml, NvmlState, NvmlUnavailable, classify

from anex_agent.testing.fake_nvml import FakeGpu


def _nvml_library_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


no_library = pytest.mark.skipif(_nvml_library_present(), reason="libnvidia-ml.so.1 is installed: not a no-driver machine")


@no_library
def test_real_pynvml_without_driver_is_a_clean_no_driver_state(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "pynvml", real_pynvml)
    nvml = Nvml()
    with caplog.at_level(logging.INFO, logger="anex_agent.gpu.nvml"):
        assert nvml.ensure_ready() is False
    assert nvml.status.state is NvmlState.no_driver
    assert nvml.status.code == real_pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    assert "libnvidia-ml.so.1" in nvml.status.reason
    with pytest.raises(NvmlUnavailable):
        nvml.call("nvmlDeviceGetCount")
    assert sum("GPU telemetry off" in r.message for r in caplog.records) == 1


def test_missing_pynvml_module_is_no_driver(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    nvml = Nvml()
    assert nvml.ensure_ready() is False
    assert nvml.status.state is NvmlState.no_driver
    assert "nvidia-ml-py" in nvml.status.reason


@pytest.mark.parametrize(
    ("code", "state", "words"),
    [
        (real_pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, NvmlState.no_driver, "libnvidia-ml.so.1"),
        (real_pynvml.NVML_ERROR_DRIVER_NOT_LOADED, NvmlState.driver_not_loaded, "not loaded"),
        (real_pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, NvmlState.version_mismatch, "reboot"),
        (real_pynvml.NVML_ERROR_GPU_IS_LOST, NvmlState.gpu_lost, "lost"),
        (real_pynvml.NVML_ERROR_RESET_REQUIRED, NvmlState.reset_required, "reset"),
        (real_pynvml.NVML_ERROR_NO_PERMISSION, NvmlState.no_permission, "permission"),
        (real_pynvml.NVML_ERROR_UNKNOWN, NvmlState.error, "999"),
    ],
)
def test_init_failures_are_classified(install_fake, code, state, words):
    fake = install_fake()
    fake.init_error = code
    nvml = Nvml()
    assert nvml.ensure_ready() is False
    assert nvml.status.state is state
    assert nvml.status.code == code
    assert words in nvml.status.reason


def test_classify_uses_the_real_error_subclasses():
    err = real_pynvml.NVMLError(real_pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    assert type(err).__name__ == "NVMLError_LibRmVersionMismatch"
    status = classify(err)
    assert status.state is NvmlState.version_mismatch
    assert "driver was updated" in status.reason and "reload" in status.reason


def test_init_runs_once_and_retries_are_rate_limited(install_fake, caplog):
    fake = install_fake()
    fake.init_error = real_pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    now = [1000.0]
    nvml = Nvml(retry_interval=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="anex_agent.gpu.nvml"):
        for _ in range(50):
            assert nvml.ensure_ready() is False
            now[0] += 1.0  # 50 s in all: still inside the retry interval
        assert fake.init_calls == 1
        fake.init_error = None  # the driver got loaded
        now[0] += 11.0
        assert nvml.ensure_ready() is True
        assert nvml.ensure_ready() is True
    assert fake.init_calls == 2
    assert nvml.status.state is NvmlState.ok
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "driver_not_loaded" in warnings[0].message
    assert any("NVML ready" in r.message for r in caplog.records)


def test_not_supported_is_absent_not_an_error(install_fake):
    fake = install_fake([FakeGpu(errors={"nvmlDeviceGetMemoryBusWidth": real_pynvml.NVML_ERROR_NOT_SUPPORTED,
                                         "nvmlDeviceGetPowerUsage": real_pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})])
    nvml = Nvml()
    assert nvml.ensure_ready()
    handle = nvml.call("nvmlDeviceGetHandleByIndex", 0)
    assert nvml.call("nvmlDeviceGetMemoryBusWidth", handle) is ABSENT
    assert nvml.call("nvmlDeviceGetPowerUsage", handle) is ABSENT
    assert nvml.call("nvmlDeviceGetTemperature", handle, fake.module.NVML_TEMPERATURE_GPU) == 41
    assert nvml.call("nvmlDeviceGetNoSuchFunction", handle) is ABSENT


@pytest.mark.parametrize(("code", "state"), [(real_pynvml.NVML_ERROR_GPU_IS_LOST, NvmlState.gpu_lost),
                                             (real_pynvml.NVML_ERROR_RESET_REQUIRED, NvmlState.reset_required)])
def test_device_errors_concern_one_gpu(install_fake, code, state):
    install_fake([FakeGpu(errors={"nvmlDeviceGetUtilizationRates": code})])
    nvml = Nvml()
    assert nvml.ensure_ready()
    handle = nvml.call("nvmlDeviceGetHandleByIndex", 0)
    with pytest.raises(DeviceFailure) as info:
        nvml.call("nvmlDeviceGetUtilizationRates", handle)
    assert info.value.status.state is state
    assert nvml.status.state is NvmlState.ok  # NVML as a whole still works


def test_version_mismatch_after_init_breaks_nvml_and_recovers_after_reload(install_fake):
    fake = install_fake()
    now = [0.0]
    nvml = Nvml(retry_interval=30.0, clock=lambda: now[0])
    assert nvml.ensure_ready()
    generation = nvml.generation
    fake.fail_all = real_pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH  # driver updated under us
    with pytest.raises(NvmlUnavailable) as info:
        nvml.call("nvmlDeviceGetCount")
    assert info.value.status.state is NvmlState.version_mismatch
    assert nvml.status.state is NvmlState.version_mismatch
    assert fake.shutdown_calls == 1
    fake.fail_all = None
    fake.init_error = real_pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH  # until the reboot
    now[0] += 31
    assert nvml.ensure_ready() is False
    fake.init_error = None  # rebooted / modules reloaded
    now[0] += 31
    assert nvml.ensure_ready() is True
    assert nvml.generation == generation + 1
