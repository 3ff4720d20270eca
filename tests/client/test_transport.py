"""The coordinator URL check and the TLS client context (anex_agent.client.transport)."""

from __future__ import annotations

import logging
import socket
import ssl

import pytest

from anex_agent.client import transport
from anex_agent.errors import ConfigError


@pytest.fixture(autouse=True)
def no_connections(monkeypatch):
    """The check is parse-level: it must never open a connection (to 8.8.8.8 or anywhere)."""
    def refuse(*args, **kwargs):
        raise AssertionError("the URL check opened a connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def resolver(*addresses):
    calls = []

    def resolve(host):
        calls.append(host)
        return list(addresses)

    resolve.calls = calls
    return resolve


def check(url, *, allow=False, resolve=None):
    return transport.check_coordinator_url(url, "--coordinator", allow_insecure=allow,
                                           resolve=resolve or resolver())


def test_plain_http_to_a_public_address_is_refused_naming_the_way_out():
    with pytest.raises(ConfigError) as info:
        check("http://8.8.8.8:8700")
    assert info.value.source == "--coordinator"
    assert "ANEX_ALLOW_INSECURE=1" in info.value.message and "clear text" in info.value.message
    assert "https://" in info.value.message


@pytest.mark.parametrize("url", ["http://[2001:4860:4860::8888]:8700", "http://[::ffff:8.8.8.8]:8700"])
def test_public_ipv6_and_mapped_addresses_are_public(url):
    with pytest.raises(ConfigError):
        check(url)


def test_a_name_resolving_to_any_public_address_counts_as_public():
    resolve = resolver("10.0.0.5", "8.8.4.4")
    with pytest.raises(ConfigError) as info:
        check("http://coordinator.example:8700", resolve=resolve)
    assert "8.8.4.4" in info.value.message and resolve.calls == ["coordinator.example"]


def test_a_name_that_does_not_resolve_is_refused():
    def fail(host):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with pytest.raises(ConfigError) as info:
        check("http://nowhere.invalid:8700", resolve=fail)
    assert "does not resolve" in info.value.message


def test_allowed_explicitly_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        assert check("http://8.8.8.8:8700", allow=True) == "insecure"
    assert any("clear text" in r.getMessage() for r in caplog.records)


def test_private_addresses_warn_and_loopback_is_silent(caplog):
    with caplog.at_level(logging.WARNING):
        assert check("http://127.0.0.1:8700") == "loopback"
        assert check("http://[::1]:8700") == "loopback"
        assert check("http://localhost:8700", resolve=resolver("127.0.0.1", "::1")) == "loopback"
    assert not caplog.records
    for url in ("http://10.1.2.3:8700", "http://192.168.100.1:8700", "http://[fd00::1]:8700", "http://100.64.0.1:80"):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert check(url) == "private"
        assert len(caplog.records) == 1 and "private address" in caplog.records[0].getMessage()


def test_https_is_accepted_without_resolving():
    resolve = resolver("8.8.8.8")
    assert check("https://8.8.8.8:8700", resolve=resolve) == "https"
    assert check("https://coordinator.example", resolve=resolve) == "https"
    assert resolve.calls == []


@pytest.mark.parametrize("value, expected", [("1", True), ("true", True), ("YES", True), (" on ", True), ("", False),
                                             ("0", False), ("off", False), (None, False)])
def test_allow_insecure_variable(value, expected):
    env = {} if value is None else {"ANEX_ALLOW_INSECURE": value}
    assert transport.allow_insecure_from(env) is expected


def test_allow_insecure_variable_rejects_other_values():
    with pytest.raises(ConfigError) as info:
        transport.allow_insecure_from({"ANEX_ALLOW_INSECURE": "maybe"})
    assert info.value.source == "ANEX_ALLOW_INSECURE"
    assert "1/0, true/false, yes/no or on/off" in str(info.value)


def test_client_context_verifies_with_tls_1_2_or_newer():
    context = transport.client_ssl_context()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2


def test_ca_file_errors_name_the_source(tmp_path):
    with pytest.raises(ConfigError) as info:
        transport.parse_ca_file(str(tmp_path / "missing.pem"), "ANEX_CA_FILE")
    assert info.value.source == "ANEX_CA_FILE" and "no such file" in info.value.message
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    with pytest.raises(ConfigError) as info:
        transport.parse_ca_file(str(tmp_path / "junk.pem"), "--ca-file")
    assert info.value.source == "--ca-file"
    assert transport.parse_ca_file("", "--ca-file") is None
