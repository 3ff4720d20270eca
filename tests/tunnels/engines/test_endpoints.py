"""The one endpoint resolution policy: names to addresses for every engine, followed when they move."""

from __future__ import annotations

import asyncio
import base64

import pytest

from anex_agent.errors import EngineError
from anex_agent.tunnels.engines.config import DesiredConfig, PeerConfig
from anex_agent.tunnels.engines.endpoints import EndpointPolicy
from tests.polling import wait_until

KEYS = [base64.b64encode(bytes([i]) * 32).decode() for i in range(1, 4)]


def desired(*endpoints: str | None) -> DesiredConfig:
    return DesiredConfig(private_key=bytes(32), listen_port=None, address="10.254.0.5/16", mtu=1400, peers=tuple(
        PeerConfig(public_key=k, endpoint=e, allowed_ips=("10.254.0.0/16",)) for k, e in zip(KEYS, endpoints)))


@pytest.fixture
def dns():
    answers: dict[str, list[str]] = {}
    asked: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:
        asked.append(host)
        if host not in answers:
            raise OSError("no such name")
        return list(answers[host])

    return answers, asked, resolve


async def test_names_become_addresses_literals_and_none_stay(dns):
    answers, asked, resolve = dns
    answers["gw.test"] = ["192.0.2.1", "192.0.2.2"]
    got = await EndpointPolicy(resolve).resolve(desired("gw.test:51820", "[2001:db8::1]:51820", None))
    assert [p.endpoint for p in got.peers] == ["192.0.2.1:51820", "[2001:db8::1]:51820", None]
    assert asked == ["gw.test"]  # literals are never looked up
    answers["v6.test"] = ["2001:db8::7"]
    got = await EndpointPolicy(resolve).resolve(desired("v6.test:1"))
    assert got.peers[0].endpoint == "[2001:db8::7]:1"


async def test_round_robin_answers_do_not_make_the_peer_hop(dns):
    answers, _, resolve = dns
    policy = EndpointPolicy(resolve)
    answers["gw.test"] = ["192.0.2.1", "192.0.2.2"]
    await policy.resolve(desired("gw.test:51820"))
    answers["gw.test"] = ["192.0.2.2", "192.0.2.1"]  # same set, other order
    assert await policy.moved() == []
    assert (await policy.resolve(desired("gw.test:51820"))).peers[0].endpoint == "192.0.2.1:51820"
    answers["gw.test"] = ["198.51.100.7"]
    assert await policy.moved() == ["peer endpoint gw.test:51820 now resolves to 198.51.100.7 (was 192.0.2.1)"]


async def test_a_first_failure_raises_a_later_one_keeps_the_last_good_address(dns):
    answers, _, resolve = dns
    policy = EndpointPolicy(resolve)
    with pytest.raises(EngineError, match="cannot resolve peer endpoint 'gw.test:51820'"):
        await policy.resolve(desired("gw.test:51820"))
    answers["gw.test"] = ["192.0.2.1"]
    await policy.resolve(desired("gw.test:51820"))
    del answers["gw.test"]
    assert (await policy.resolve(desired("gw.test:51820"))).peers[0].endpoint == "192.0.2.1:51820"
    assert await policy.moved() == []


async def test_follow_reapplies_only_when_a_name_moves(dns):
    answers, asked, resolve = dns
    policy = EndpointPolicy(resolve)
    answers["gw.test"] = ["192.0.2.1"]
    applied = [await policy.resolve(desired("gw.test:51820"))]

    async def reapply():
        applied.append(await policy.resolve(desired("gw.test:51820")))

    def rounds(n: int):  # the follower looked the name up n more times (a look-up per round)
        mark = len(asked)
        return lambda: len(asked) >= mark + n

    follower = asyncio.create_task(policy.follow(reapply, 0.02), name="test-follow")
    try:
        await wait_until(rounds(3), what="three rounds of the follower")
        assert len(applied) == 1
        answers["gw.test"] = ["198.51.100.7"]
        await wait_until(lambda: len(applied) > 1, what="the follower applying the moved name")
        assert applied[-1].peers[0].endpoint == "198.51.100.7:51820"
        await wait_until(rounds(3), what="three more rounds of the follower")
        assert len(applied) == 2  # it stays where it moved
    finally:
        follower.cancel()
