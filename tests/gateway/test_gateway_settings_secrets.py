"""Gateway settings: the token from a file or the environment, never in repr; the coordinator URL check."""

from __future__ import annotations

import argparse
import logging

import pytest

from anex_agent.errors import ConfigError
from anex_agent.gateway import cli
from anex_agent.gateway.settings import from_args


def parse(argv, env=None):
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    return from_args(parser.parse_args(["--endpoint", "gw.example:51820", *argv]), env or {})


URL = ["--coordinator", "http://127.0.0.1:8700"]


def test_token_from_file_variable_and_variable_file(tmp_path):
    (tmp_path / "t").write_text("gw-s3cret\n")
    assert parse([*URL, "--token-file", str(tmp_path / "t")]).token == "gw-s3cret"
    assert parse(URL, {"ANEX_GATEWAY_TOKEN": "gw-env"}).token == "gw-env"
    assert parse(URL, {"ANEX_GATEWAY_TOKEN_FILE": str(tmp_path / "t")}).token == "gw-s3cret"
    assert parse([], {"ANEX_COORDINATOR_URL": "http://127.0.0.1:1"}).coordinator_url == "http://127.0.0.1:1"


def test_empty_token_file_names_the_flag(tmp_path):
    (tmp_path / "t").write_text("")
    with pytest.raises(ConfigError) as info:
        parse([*URL, "--token-file", str(tmp_path / "t")])
    assert info.value.source == "--token-file"


def test_token_flag_warns(caplog):
    with caplog.at_level(logging.WARNING):
        assert parse([*URL, "--token", "gw-s3cret"]).token == "gw-s3cret"
    assert any("--token-file" in r.getMessage() and "ps" in r.getMessage() for r in caplog.records)


def test_repr_shows_no_secret(tmp_path):
    settings = parse(URL, {"ANEX_GATEWAY_TOKEN": "gw-s3cret"})
    assert "gw-s3cret" not in repr(settings) and "gw-s3cret" not in str(settings)
    assert "127.0.0.1:8700" in repr(settings)


def test_public_http_refused_unless_allowed():
    with pytest.raises(ConfigError) as info:
        parse(["--coordinator", "http://8.8.8.8:8700"])
    assert info.value.source == "--coordinator" and "--allow-insecure" in info.value.message
    assert parse(["--coordinator", "http://8.8.8.8:8700", "--allow-insecure"]).coordinator_url
    assert parse(["--coordinator", "http://8.8.8.8:8700"], {"ANEX_ALLOW_INSECURE": "1"}).coordinator_url


def test_private_http_warns(caplog):
    with caplog.at_level(logging.WARNING):
        parse(["--coordinator", "http://10.20.0.1:8700"])
    assert any("private address" in r.getMessage() for r in caplog.records)


def test_ca_file_names_the_flag(tmp_path):
    with pytest.raises(ConfigError) as info:
        parse([*URL, "--ca-file", str(tmp_path / "nope.pem")])
    assert info.value.source == "--ca-file"
