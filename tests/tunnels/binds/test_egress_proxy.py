"""The egress proxy for a URL follows HTTPS_PROXY / HTTP_PROXY / NO_PROXY, either case, no cross-scheme fallback."""

from __future__ import annotations

import pytest

from anex_agent.tunnels.binds.egress_proxy import proxy_for


@pytest.mark.parametrize("url, env, expected", [
    ("wss://gw.example.com/r", {"HTTPS_PROXY": "http://proxy:3128"}, "http://proxy:3128"),
    ("wss://gw.example.com/r", {"https_proxy": "proxy:3128"}, "http://proxy:3128"),
    ("ws://gw.example.com/r", {"HTTPS_PROXY": "http://proxy:3128"}, None),
    ("ws://gw.example.com/r", {"HTTP_PROXY": "http://p:1"}, "http://p:1"),
    ("wss://gw.example.com/r", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "example.com"}, None),
    ("wss://gw.example.com/r", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": ".example.com"}, None),
    ("wss://gw.example.com/r", {"HTTPS_PROXY": "http://p:1", "no_proxy": "other.com, *"}, None),
    ("wss://gw.example.com/r", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "ample.com,10.0.0.1"}, "http://p:1"),
    ("wss://10.0.0.1:443/r", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.0.0.1"}, None),
    ("wss://gw.example.com/r", {}, None),
    ("https://coordinator.example.com", {"HTTPS_PROXY": "http://p:1"}, "http://p:1"),   # the coordinator too
    ("http://10.0.0.1:8700", {"HTTP_PROXY": "http://p:2", "HTTPS_PROXY": "http://p:1"}, "http://p:2"),
])
def test_proxy_choice_follows_the_environment(url, env, expected):
    assert proxy_for(url, env) == expected
