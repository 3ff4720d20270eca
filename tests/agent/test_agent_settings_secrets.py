"""Agent settings: the join token and proxy password from files, never in repr; the coordinator URL check."""

from __future__ import annotations

import argparse
import logging

import pytest

from anex_agent.agent import settings as s
from anex_agent.errors import ConfigError

BASE = {"ANEX_COORDINATOR_URL": "http://10.0.0.1:8080", "ANEX_STATE_DIR": "/tmp/x"}


def parse(env, argv=()):
    parser = argparse.ArgumentParser()
    s.add_arguments(parser)
    return s.from_args(parser.parse_args(list(argv)), env)


def test_token_and_proxy_auth_from_files(tmp_path):
    (tmp_path / "token").write_text("join-s3cret\n")
    (tmp_path / "auth").write_text("user:pr0xy-pw\n")
    cfg = parse(BASE, ["--token-file", str(tmp_path / "token"), "--proxy-auth-file", str(tmp_path / "auth")])
    assert cfg.join_token == "join-s3cret"
    assert cfg.proxy_auth.username == "user" and cfg.proxy_auth.password == "pr0xy-pw"
    cfg = parse({**BASE, "ANEX_JOIN_TOKEN_FILE": str(tmp_path / "token"), "ANEX_PROXY_AUTH_FILE": str(tmp_path / "auth")})
    assert cfg.join_token == "join-s3cret" and cfg.proxy_auth.password == "pr0xy-pw"


def test_empty_token_file_names_its_flag_or_variable(tmp_path):
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError) as info:
        parse(BASE, ["--token-file", str(tmp_path / "empty")])
    assert info.value.source == "--token-file"
    with pytest.raises(ConfigError) as info:
        parse({**BASE, "ANEX_JOIN_TOKEN_FILE": str(tmp_path / "missing")})
    assert info.value.source == "ANEX_JOIN_TOKEN_FILE"


def test_token_flag_warns(caplog):
    with caplog.at_level(logging.WARNING):
        cfg = parse(BASE, ["--token", "join-s3cret", "--proxy-auth", "u:pr0xy-pw"])
    assert cfg.join_token == "join-s3cret"
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "--token-file" in messages and "--proxy-auth-file" in messages


def test_repr_shows_no_secret(tmp_path):
    cfg = parse({**BASE, "ANEX_JOIN_TOKEN": "join-s3cret", "ANEX_PROXY_AUTH": "user:pr0xy-pw"})
    assert cfg.join_token == "join-s3cret"
    text = repr(cfg) + str(cfg) + repr(cfg.proxy_auth)
    assert "join-s3cret" not in text and "pr0xy-pw" not in text
    assert "10.0.0.1" in text  # the rest is still shown


def test_public_http_coordinator_is_refused_before_anything_starts():
    with pytest.raises(ConfigError) as info:
        parse({**BASE, "ANEX_COORDINATOR_URL": "http://8.8.8.8:8700"})
    assert info.value.source == "ANEX_COORDINATOR_URL" and "ANEX_ALLOW_INSECURE=1" in info.value.message
    with pytest.raises(ConfigError) as info:
        parse(BASE, ["--coordinator", "http://8.8.8.8:8700"])
    assert info.value.source == "--coordinator"


def test_public_http_allowed_explicitly(caplog):
    with caplog.at_level(logging.WARNING):
        cfg = parse({**BASE, "ANEX_COORDINATOR_URL": "http://8.8.8.8:8700", "ANEX_ALLOW_INSECURE": "1"})
    assert cfg.coordinator_url == "http://8.8.8.8:8700"
    assert any("clear text" in r.getMessage() for r in caplog.records)
    assert parse({**BASE, "ANEX_COORDINATOR_URL": "http://8.8.8.8:8700"}, ["--allow-insecure"]).coordinator_url


def test_private_http_warns_once(caplog):
    with caplog.at_level(logging.WARNING):
        parse(BASE)
    assert [r.getMessage() for r in caplog.records if "private address" in r.getMessage()]


def test_ca_file(tmp_path):
    with pytest.raises(ConfigError) as info:
        parse({**BASE, "ANEX_CA_FILE": str(tmp_path / "missing.pem")})
    assert info.value.source == "ANEX_CA_FILE"
    with pytest.raises(ConfigError) as info:
        parse(BASE, ["--ca-file", str(tmp_path / "missing.pem")])
    assert info.value.source == "--ca-file"
    assert parse(BASE).ca_file is None
