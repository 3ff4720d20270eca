"""Agent API access tokens: sign with the coordinator key, verify offline on the node."""

from __future__ import annotations

import base64

import pytest

from anex_agent import access_token as at

KEY = at.generate_signing_key()
VERIFY = at.verify_key_of(KEY)


def test_round_trip():
    token, claims = at.sign(KEY, "n-1", now=1000, ttl=300)
    assert token.startswith("anexat.")
    got = at.verify(VERIFY, token, node_id="n-1", now=1299)
    assert got == claims and got.expires_at == 1300


@pytest.mark.parametrize(
    "mutate, node, now, reason",
    [
        (lambda t: t, "n-2", 1000, "another node"),
        (lambda t: t, "n-1", 1300, "expired"),
        (lambda t: t, "n-1", 0, "future"),
        (lambda t: t[:-2] + ("AA" if t[-2:] != "AA" else "BB"), "n-1", 1000, "signature"),
        (lambda t: t.replace("anexat.", "jwt."), "n-1", 1000, "not an access token"),
        (lambda t: "anexat.e30." + t.rsplit(".", 1)[1], "n-1", 1000, "signature"),
        (lambda t: "garbage", "n-1", 1000, "not an access token"),
    ],
)
def test_rejections(mutate, node, now, reason):
    token, _ = at.sign(KEY, "n-1", now=1000, ttl=300)
    with pytest.raises(at.InvalidAccessToken, match=reason):
        at.verify(VERIFY, mutate(token), node_id=node, now=now)


def test_other_key_and_bad_verify_key():
    token, _ = at.sign(KEY, "n-1", now=1000, ttl=300)
    with pytest.raises(at.InvalidAccessToken, match="signature"):
        at.verify(at.verify_key_of(at.generate_signing_key()), token, node_id="n-1", now=1000)
    with pytest.raises(at.InvalidAccessToken, match="verify key"):
        at.verify("not base64!", token, node_id="n-1", now=1000)


def test_ttl_limits():
    with pytest.raises(ValueError):
        at.sign(KEY, "n-1", now=0, ttl=0)
    with pytest.raises(ValueError):
        at.sign(KEY, "n-1", now=0, ttl=at.MAX_TTL + 1)
    assert len(base64.b64decode(VERIFY)) == 32


def test_core_is_pure():
    import inspect

    source = inspect.getsource(at)
    for module in ("asyncio", "socket", "import time"):
        assert module not in source
