"""The live selector asks the provider on every selection (no cached answer), skips offers a
provision already tried and banned Vast.AI machines; provider settings come from the
environment without ever showing a key."""

from __future__ import annotations

import os

import pytest
from aiohttp.test_utils import TestServer

from anex_agent.coordinator.provisioning import config as prov_config
from anex_agent.coordinator.provisioning.config import ProvisioningSettings, build_providers
from anex_agent.coordinator.provisioning.selector import LiveSelector
from anex_agent.errors import ConfigError
from anex_agent.selection.bans import MemoryBans
from anex_agent.selection.config import SelectionConfig
from tests.selection.fake_providers import FakeProvider


async def test_live_selection_asks_every_time_and_skips_tried_and_banned(monkeypatch):
    from anex_agent.providers.vastai import offers as vastai

    async def not_here(self, filters):
        raise AssertionError("the provider was asked from the coordinator's process")

    monkeypatch.setattr(vastai.VastAISource, "offers", not_here)  # the worker is a fresh interpreter
    fake = FakeProvider()
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    try:
        config = SelectionConfig.from_env({"ANEX_VASTAI_API_KEY": fake.api_key,
                                           "ANEX_VASTAI_URL": str(server.make_url("/api/v0"))})
        assert config.policy.cache_ttl == 30  # the selection route caches; provisioning must not
        bans = MemoryBans()
        selector = LiveSelector(config, bans)  # type: ignore[arg-type]
        assert selector.worker.pid is None  # the worker process starts with the first selection
        first = await selector.select({}, providers=("vastai",), exclude=())
        assert first.candidates and len(fake.requests) == 1
        top = first.candidates[0]
        assert top.provider == "vastai" and top.machine_id and top.price_per_hour is not None
        again = await selector.select({}, providers=("vastai",), exclude={("vastai", top.offer_id)})
        assert len(fake.requests) == 2  # asked again: live
        assert top.offer_id not in [c.offer_id for c in again.candidates]
        await bans.ban(top.machine_id, "did not boot", 3600)
        banned = await selector.select({}, providers=("vastai",), exclude=())
        assert top.machine_id not in [c.machine_id for c in banned.candidates]
        none = await selector.select({}, providers=("runpod",), exclude=())
        assert none.candidates == [] and "no provider" in none.why_none
        # the provider was asked from the selection worker's process, never the coordinator's
        assert selector.worker.pid is not None and selector.worker.pid != os.getpid()
    finally:
        await selector.worker.aclose()
        await server.close()


def test_settings_from_env_name_the_variable():
    settings = ProvisioningSettings.from_env({"ANEX_PROVISION_COORDINATOR_URL": "https://coord.example/",
                                              "ANEX_PROVISION_BOOT_TIMEOUT": "300",
                                              "ANEX_PROVISION_POLL_INTERVAL": "0.25"})
    assert settings.coordinator_url == "https://coord.example" and settings.boot_timeout == 300
    assert settings.poll_interval == 0.25 and ProvisioningSettings.from_env({}).poll_interval == 1.0
    for name, value in [("ANEX_PROVISION_BOOT_TIMEOUT", "soon"), ("ANEX_PROVISION_MAX_ATTEMPTS", "0"),
                        ("ANEX_PROVISION_COORDINATOR_URL", "coord:8700"), ("ANEX_PROVISION_LEASE", "nan"),
                        ("ANEX_PROVISION_POLL_INTERVAL", "0")]:
        with pytest.raises(ConfigError) as err:
            ProvisioningSettings.from_env({name: value})
        assert name in str(err.value)


def test_registry_builds_configured_providers_without_showing_keys(monkeypatch, caplog):
    made = {}

    def factory(config, settings):
        made["config"] = config
        return object()

    def missing(config, settings):
        import anex_agent.no_such_module  # noqa: F401  (a client this build lacks)

    monkeypatch.setattr(prov_config, "RENTAL_FACTORIES", {"vastai": factory, "runpod": missing})
    selection = SelectionConfig.from_env({"ANEX_VASTAI_API_KEY": "vast-secret-key", "ANEX_RUNPOD_API_KEY": "rp-key"})
    providers = build_providers(selection)
    assert set(providers) == {"vastai"}  # runpod: this build cannot rent from it, said in the log
    assert made["config"].api_key == "vast-secret-key"
    assert "vast-secret-key" not in repr(made["config"]) and "rp-key" not in caplog.text
    assert "runpod" in caplog.text


def test_runpod_rentals_go_to_the_configured_rest_url():
    settings = ProvisioningSettings.from_env({"ANEX_RUNPOD_REST_URL": "http://127.0.0.1:9/v1/"})
    selection = SelectionConfig.from_env({"ANEX_RUNPOD_API_KEY": "rp-key"})
    (rentals,) = build_providers(selection, settings).values()
    assert rentals.config.rest_url == "http://127.0.0.1:9/v1" and rentals.config.api_key == "rp-key"
    with pytest.raises(ConfigError, match="ANEX_RUNPOD_REST_URL"):
        ProvisioningSettings.from_env({"ANEX_RUNPOD_REST_URL": "rest.runpod.io"})
