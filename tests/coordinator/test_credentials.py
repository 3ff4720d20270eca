"""Secrets: format, hashing, admin token file handling, join token rules."""

from __future__ import annotations

import os

import pytest

from anex_agent.coordinator import credentials
from anex_agent.errors import ConfigError


def test_secrets_are_prefixed_random_and_hashed():
    a = credentials.new_secret(credentials.NODE_CREDENTIAL)
    b = credentials.new_secret(credentials.NODE_CREDENTIAL)
    assert a != b and a.startswith("anexnc_") and len(a) == len("anexnc_") + 43
    assert credentials.hash_secret(a) == credentials.hash_secret(a)
    assert credentials.hash_secret(a) != credentials.hash_secret(b)
    assert a not in credentials.hash_secret(a) and len(credentials.hash_secret(a)) == 64
    assert credentials.same_secret(a, a) and not credentials.same_secret(a, b)


def test_admin_token_generated_once_with_mode_0600(tmp_path):
    token, where = credentials.load_admin_token(tmp_path / "state", environ={})
    path = tmp_path / "state" / "admin-token"
    assert where == str(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert token.startswith("anexadm_")
    assert credentials.load_admin_token(tmp_path / "state", environ={})[0] == token


def test_admin_token_from_environment_wins(tmp_path):
    token, where = credentials.load_admin_token(tmp_path, environ={"ANEX_ADMIN_TOKEN": "x" * 32})
    assert token == "x" * 32 and "ANEX_ADMIN_TOKEN" in where
    assert not (tmp_path / "admin-token").exists()
    with pytest.raises(ConfigError, match="too short"):
        credentials.load_admin_token(tmp_path, environ={"ANEX_ADMIN_TOKEN": "short"})


def test_admin_token_file_readable_by_others_is_refused(tmp_path):
    credentials.load_admin_token(tmp_path, environ={})
    os.chmod(tmp_path / "admin-token", 0o644)
    with pytest.raises(ConfigError, match="0600"):
        credentials.load_admin_token(tmp_path, environ={})
