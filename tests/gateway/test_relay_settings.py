"""The gateway's relay flags: --ws-listen, --tls-cert, --tls-key, --ws-url checked together."""

from __future__ import annotations

import pytest

from anex_agent.errors import ConfigError
from anex_agent.gateway.settings import build_settings

BASE = {"coordinator_url": "http://127.0.0.1:8700", "token": "t", "endpoint": "192.0.2.1:51820"}


def test_no_relay_by_default():
    s = build_settings(**BASE)
    assert s.ws_listen is None and s.tls_cert is None


def test_plain_and_tls_relay(tmp_path):
    s = build_settings(**BASE, ws_listen="0.0.0.0:8443", ws_url="wss://relay.example.com/relay")
    assert s.ws_listen == ("0.0.0.0", 8443) and s.tls_cert is None
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("x")
    key.write_text("y")
    s = build_settings(**BASE, ws_listen="[::]:443", tls_cert=str(cert), tls_key=str(key))
    assert s.ws_listen == ("::", 443) and s.tls_cert == cert and s.tls_key == key


@pytest.mark.parametrize("kwargs, flag", [
    ({"ws_listen": "8443"}, "--ws-listen"),
    ({"ws_listen": "0.0.0.0:99999"}, "--ws-listen"),
    ({"ws_url": "http://relay/", "ws_listen": "0.0.0.0:8443"}, "--ws-url"),
    ({"ws_listen": "0.0.0.0:8443", "tls_cert": "/nonexistent.pem", "tls_key": "/nonexistent.key"}, "--tls-cert"),
    ({"ws_listen": "0.0.0.0:8443", "tls_cert": "/etc/hostname"}, "--tls-key"),
    ({"tls_cert": "/etc/hostname", "tls_key": "/etc/hostname"}, "--tls-cert"),
])
def test_bad_relay_flags_name_the_flag(kwargs, flag):
    with pytest.raises(ConfigError) as err:
        build_settings(**BASE, **kwargs)
    assert err.value.source == flag


def test_trusted_proxies_are_networks_and_need_the_relay():
    s = build_settings(**BASE, ws_listen="0.0.0.0:8443", ws_trusted_proxies=["10.0.0.7", "10.0.0.0/8", "fd00::/64"])
    assert s.ws_trusted_proxies == ("10.0.0.7/32", "10.0.0.0/8", "fd00::/64")
    assert build_settings(**BASE, ws_listen="0.0.0.0:8443").ws_trusted_proxies == ()
    for bad in ({"ws_listen": "0.0.0.0:8443", "ws_trusted_proxies": ["proxy.example"]},
                {"ws_trusted_proxies": ["10.0.0.0/8"]}):
        with pytest.raises(ConfigError) as err:
            build_settings(**BASE, **bad)
        assert err.value.source == "--ws-trusted-proxy"


def test_a_relay_url_without_a_relay_is_refused_naming_both_flags():
    """The relay runs only inside the gateway (the hub's key, the watched peer set): advertising
    one that nothing serves would send every UDP-blocked node to a dead address."""
    with pytest.raises(ConfigError) as err:
        build_settings(**BASE, ws_url="wss://relay.example.com/relay")
    assert err.value.source == "--ws-url" and "--ws-listen HOST:PORT" in str(err.value)
    behind_a_proxy = build_settings(**BASE, ws_listen="127.0.0.1:8443", ws_url="wss://relay.example.com/relay")
    assert behind_a_proxy.ws_url == "wss://relay.example.com/relay" and behind_a_proxy.ws_listen == ("127.0.0.1", 8443)
