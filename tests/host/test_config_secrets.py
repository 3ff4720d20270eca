"""Secrets from a flag, a file or the environment (anex_agent.host.config_secrets)."""

from __future__ import annotations

import logging

import pytest

from anex_agent.host.config_secrets import SecretSpec, pick_secret, read_secret_file
from anex_agent.errors import ConfigError

TOKEN = SecretSpec("--token", "ANEX_JOIN_TOKEN")


def test_file_is_read_once_and_stripped(tmp_path):
    path = tmp_path / "token"
    path.write_text("  s3cret-token\n\n")
    assert pick_secret(TOKEN, {}, file_value=str(path)) == ("s3cret-token", "--token-file")


@pytest.mark.parametrize("content", ["", "\n", "  \t\n"])
def test_empty_file_is_an_error_naming_the_flag(tmp_path, content):
    path = tmp_path / "token"
    path.write_text(content)
    with pytest.raises(ConfigError) as info:
        pick_secret(TOKEN, {}, file_value=path)
    assert info.value.source == "--token-file" and "empty" in info.value.message


def test_missing_or_directory_file_is_an_error_naming_the_source(tmp_path):
    with pytest.raises(ConfigError) as info:
        pick_secret(TOKEN, {}, file_value=tmp_path / "nope")
    assert info.value.source == "--token-file" and "no such file" in info.value.message
    with pytest.raises(ConfigError) as info:
        read_secret_file(tmp_path, "ANEX_JOIN_TOKEN_FILE")
    assert info.value.source == "ANEX_JOIN_TOKEN_FILE"


def test_flag_on_the_command_line_warns_and_names_the_twin(caplog):
    with caplog.at_level(logging.WARNING):
        assert pick_secret(TOKEN, {}, flag_value="s3cret") == ("s3cret", "--token")
    [record] = [r for r in caplog.records if r.levelno == logging.WARNING]
    text = record.getMessage()
    assert "--token on the command line" in text and "ps" in text and "--token-file" in text
    assert "ANEX_JOIN_TOKEN" in text and "s3cret" not in text


def test_environment_and_its_file_twin(tmp_path, caplog):
    path = tmp_path / "t"
    path.write_text("from-file\n")
    with caplog.at_level(logging.WARNING):
        assert pick_secret(TOKEN, {"ANEX_JOIN_TOKEN": " from-env "}) == ("from-env", "ANEX_JOIN_TOKEN")
        assert pick_secret(TOKEN, {"ANEX_JOIN_TOKEN_FILE": str(path)}) == ("from-file", "ANEX_JOIN_TOKEN_FILE")
    assert not caplog.records  # the environment is not on the command line: no warning
    assert pick_secret(TOKEN, {}) == (None, None)
    (tmp_path / "empty").write_text("")
    with pytest.raises(ConfigError) as info:
        pick_secret(TOKEN, {"ANEX_JOIN_TOKEN_FILE": str(tmp_path / "empty")})
    assert info.value.source == "ANEX_JOIN_TOKEN_FILE"


def test_flags_win_over_the_environment_and_pairs_are_exclusive(tmp_path):
    path = tmp_path / "t"
    path.write_text("file")
    assert pick_secret(TOKEN, {"ANEX_JOIN_TOKEN": "env"}, file_value=path)[0] == "file"
    with pytest.raises(ConfigError) as info:
        pick_secret(TOKEN, {}, flag_value="x", file_value=path)
    assert info.value.source == "--token" and "--token-file" in info.value.message
    with pytest.raises(ConfigError) as info:
        pick_secret(TOKEN, {"ANEX_JOIN_TOKEN": "a", "ANEX_JOIN_TOKEN_FILE": str(path)})
    assert "ANEX_JOIN_TOKEN_FILE" in info.value.message


def test_a_secret_with_only_a_file_flag():
    spec = SecretSpec(None, "ANEX_DATABASE_PASSWORD", file_flag="--database-password-file")
    assert spec.file_var == "ANEX_DATABASE_PASSWORD_FILE"
    assert pick_secret(spec, {"ANEX_DATABASE_PASSWORD": "pw"}) == ("pw", "ANEX_DATABASE_PASSWORD")
