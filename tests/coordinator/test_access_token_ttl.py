"""--access-token-ttl: agent API access tokens live an hour at most (agents refuse longer ones)."""

from __future__ import annotations

import argparse

import pytest

from anex_agent import cli as anex_cli
from anex_agent.wire import access_token
from anex_agent.coordinator import cli
from anex_agent.errors import ConfigError


def parse(tmp_path, *flags):
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    return cli.settings_from(parser.parse_args(["--state-dir", str(tmp_path), *flags]), environ={})


def test_default_and_the_longest_ttl_are_accepted(tmp_path):
    assert parse(tmp_path).access_token_ttl == 300
    assert parse(tmp_path, "--access-token-ttl", "3600").access_token_ttl == 3600 == access_token.MAX_TTL


@pytest.mark.parametrize("value", ["3601", "86400", "0", "-5"])
def test_a_ttl_outside_one_hour_is_refused_naming_the_flag(tmp_path, value):
    with pytest.raises(ConfigError) as err:
        parse(tmp_path, "--access-token-ttl", value)
    assert "--access-token-ttl" in str(err.value) and "3600" in str(err.value)


def test_the_coordinator_exits_2_for_a_ttl_over_an_hour(tmp_path, capsys):
    """The CLI's entry point in this process (``python -m anex_agent`` exits with what it returns;
    test_cli_secrets_tls.py checks a real process's exit 2): a flag check needs no interpreter."""
    status = anex_cli.main(["coordinator", "--state-dir", str(tmp_path), "--access-token-ttl", "7200"])
    stderr = capsys.readouterr().err
    assert status == 2
    assert "--access-token-ttl" in stderr and "3600" in stderr and "Traceback" not in stderr
