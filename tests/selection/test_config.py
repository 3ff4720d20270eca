"""Selection settings from the environment."""

from __future__ import annotations

import pytest

from anex_agent.errors import ConfigError
from anex_agent.selection.config import SelectionConfig


def test_defaults_only_onprem():
    config = SelectionConfig.from_env({})
    assert config.vastai is None and config.runpod is None and config.ban_seconds == 3600.0
    assert (config.policy.timeout, config.policy.attempts, config.policy.cache_ttl) == (15.0, 4, 30.0)


def test_keys_enable_providers_and_never_show_in_repr():
    config = SelectionConfig.from_env({"ANEX_VASTAI_API_KEY": "vast-secret-1", "ANEX_RUNPOD_API_KEY": "rp-secret-2",
                                       "ANEX_SELECTION_BAN_SECONDS": "900", "ANEX_SELECTION_CACHE_TTL": "5"})
    assert config.vastai.api_key == "vast-secret-1" and config.runpod.api_key == "rp-secret-2"
    assert config.ban_seconds == 900 and config.vastai.policy.cache_ttl == 5
    assert "secret" not in repr(config)


@pytest.mark.parametrize("name,value", [("ANEX_SELECTION_BAN_SECONDS", "0"), ("ANEX_SELECTION_TIMEOUT", "soon"),
                                        ("ANEX_SELECTION_ATTEMPTS", "1.5"), ("ANEX_VASTAI_URL", "ftp://x"),
                                        ("ANEX_SELECTION_CACHE_TTL", "-1"),
                                        ("ANEX_SELECTION_ORDERING", "fastest"),
                                        ("ANEX_SELECTION_QUALIFICATION", "strict")])
def test_bad_values_name_the_variable(name, value):
    with pytest.raises(ConfigError) as info:
        SelectionConfig.from_env({name: value})
    assert info.value.source == name


def test_keys_from_file_twins(tmp_path):
    (tmp_path / "vast").write_text("vast-secret-1\n")
    (tmp_path / "rp").write_text("rp-secret-2\n")
    config = SelectionConfig.from_env({"ANEX_VASTAI_API_KEY_FILE": str(tmp_path / "vast"),
                                       "ANEX_RUNPOD_API_KEY_FILE": str(tmp_path / "rp")})
    assert config.vastai.api_key == "vast-secret-1" and config.runpod.api_key == "rp-secret-2"
    (tmp_path / "empty").write_text("")
    with pytest.raises(ConfigError) as info:
        SelectionConfig.from_env({"ANEX_RUNPOD_API_KEY_FILE": str(tmp_path / "empty")})
    assert info.value.source == "ANEX_RUNPOD_API_KEY_FILE"


def test_ordering_setting():
    assert SelectionConfig.from_env({}).ordering == "price"
    assert SelectionConfig.from_env({"ANEX_SELECTION_ORDERING": "prefer-onprem"}).ordering == "prefer-onprem"


def test_qualification_setting():
    assert SelectionConfig.from_env({}).qualification == "runnable"
    assert SelectionConfig.from_env({"ANEX_SELECTION_QUALIFICATION": "Full"}).qualification == "full"
    assert SelectionConfig.from_env({"ANEX_SELECTION_QUALIFICATION": "required,memory"}).qualification == \
        "required,memory"
