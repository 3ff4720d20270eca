"""What an engine is given: config validation names the field; keys stay out of repr()."""

from __future__ import annotations

import pytest

from anex_agent.errors import ConfigError
from anex_agent.tunnels.engines.config import DesiredConfig, PeerConfig

KA, KB, KC = ("A" * 43 + "=", "B" * 43 + "=", "C" * 43 + "=")


def peer(key, ips=("10.254.0.2/32",), endpoint=None, keepalive=0, psk=None):
    return PeerConfig(public_key=key, endpoint=endpoint, allowed_ips=tuple(ips), persistent_keepalive=keepalive,
                      preshared_key=psk)


def test_private_key_not_in_repr():
    cfg = DesiredConfig(private_key=bytes(range(32)), listen_port=None, address="10.254.0.5/16", mtu=1420)
    assert "private_key" not in repr(cfg) and str(bytes(range(32))) not in repr(cfg)
    assert "preshared_key" not in repr(peer(KA, psk=KB))


@pytest.mark.parametrize(
    "kwargs, source",
    [
        ({"private_key": b"x"}, "private_key"),
        ({"listen_port": 70000}, "listen_port"),
        ({"address": "10.254.0.5/40"}, "address"),
        ({"address": "not-an-ip"}, "address"),
        ({"mtu": 100}, "mtu"),
        ({"routes": ("10.96.0.0/99",)}, "routes"),
        ({"peers": (peer(KA), peer(KA))}, "peers"),
    ],
)
def test_desired_config_rejects(kwargs, source):
    args = {"private_key": bytes(32), "listen_port": None, "address": "10.254.0.5/16", "mtu": 1420, **kwargs}
    with pytest.raises(ConfigError) as info:
        DesiredConfig(**args)
    assert info.value.source == source


def test_peer_rejects_bad_allowed_ip_and_keepalive():
    with pytest.raises(ConfigError, match="allowed_ips"):
        peer(KA, ips=("10.0.0.0/33",))
    with pytest.raises(ConfigError, match="persistent_keepalive"):
        peer(KA, keepalive=70000)
