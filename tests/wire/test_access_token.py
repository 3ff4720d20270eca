"""Agent API access tokens: sign with the coordinator key, verify offline on the node."""

from __future__ import annotations

import base64

import pytest

from anex_agent.wire import access_token as at

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


def _signed(claims: dict) -> str:
    """A token signed with KEY for arbitrary claims (sign() itself refuses what these test)."""
    import json

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    payload = at._b64e(json.dumps({"v": 1, **claims}, separators=(",", ":"), sort_keys=True).encode())
    signature = Ed25519PrivateKey.from_private_bytes(KEY).sign(f"anexat.{payload}".encode())
    return f"anexat.{payload}.{at._b64e(signature)}"


def test_the_longest_lifetime_is_one_hour():
    assert at.MAX_TTL == 3600
    token, _ = at.sign(KEY, "n-1", now=1000, ttl=3600)
    assert at.verify(VERIFY, token, node_id="n-1", now=1000).expires_at == 4600
    with pytest.raises(ValueError):
        at.sign(KEY, "n-1", now=1000, ttl=3601)


@pytest.mark.parametrize("iat, exp", [(1000, 4601), (1000, 1000 + 86400), (1000, 1000), (1000, 900)])
def test_the_agent_refuses_a_lifetime_over_an_hour_or_none(iat, exp):
    token = _signed({"sub": "n-1", "iat": iat, "exp": exp, "jti": "j"})
    with pytest.raises(at.InvalidAccessToken, match="lifetime"):
        at.verify(VERIFY, token, node_id="n-1", now=950)


def test_a_token_is_good_for_one_use():
    cache = at.ReplayCache()
    token, _ = at.sign(KEY, "n-1", now=1000, ttl=300)
    claims = at.verify(VERIFY, token, node_id="n-1", now=1000)
    cache.use(claims, now=1000)
    again = at.verify(VERIFY, token, node_id="n-1", now=1001)  # still a valid signature...
    with pytest.raises(at.TokenReplayed):
        cache.use(again, now=1001)  # ...but used
    with pytest.raises(at.TokenReplayed):
        cache.use(again, now=1299)  # until the very end of its life
    other, _ = at.sign(KEY, "n-1", now=1000, ttl=300)
    cache.use(at.verify(VERIFY, other, node_id="n-1", now=1000), now=1000)  # another token is fine
    assert len(cache) == 2


def test_ids_of_expired_tokens_are_forgotten():
    cache = at.ReplayCache()
    for i in range(5):
        cache.use(at.Claims("n-1", 1000, 1000 + 10 * (i + 1), f"j{i}"), now=1000)
    assert len(cache) == 5
    cache.prune(1020)  # j0 (exp 1010) and j1 (exp 1020) are dead
    assert len(cache) == 3 and "j0" not in cache and "j1" not in cache and "j2" in cache
    cache.use(at.Claims("n-1", 1000, 2000, "late"), now=1045)  # use() prunes too
    assert len(cache) == 2 and "j3" not in cache


def test_a_full_cache_refuses_new_tokens_instead_of_forgetting_live_ones():
    cache = at.ReplayCache(capacity=2)
    cache.use(at.Claims("n-1", 1000, 1100, "a"), now=1000)
    cache.use(at.Claims("n-1", 1000, 1300, "b"), now=1000)
    with pytest.raises(at.ReplayCacheFull) as full:
        cache.use(at.Claims("n-1", 1000, 1300, "c"), now=1040)
    assert full.value.retry_after == 60  # "a" expires at 1100
    with pytest.raises(at.TokenReplayed):
        cache.use(at.Claims("n-1", 1000, 1100, "a"), now=1099)  # still remembered: never evicted
    cache.use(at.Claims("n-1", 1000, 1300, "c"), now=1100)  # "a" is dead now: room again
    assert "c" in cache and "a" not in cache and len(cache) == 2
