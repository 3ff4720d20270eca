"""Dead-peer detection (anex_agent.agent.liveness): pure rules and the watch loop with fakes."""

from __future__ import annotations

import asyncio
import time

import pytest

from anex_agent.agent.liveness import DeadPeerWatch, Silence, assign
from anex_agent.agent.path import Counters
from anex_agent.tasks import Tasks
from anex_agent.wire.keys import encode_key, generate_private_key, public_key
from anex_agent.tunnels.engines.config import DesiredConfig, PeerConfig
from tests.polling import wait_until


def test_data_sent_and_nothing_received_is_dead_after_the_delay():
    s = Silence(after=3.0)
    assert s.observe(1000, 1000, 0.0) is None      # baseline
    assert s.observe(1000, 1200, 0.5) is None      # a request went out
    assert s.observe(1000, 1400, 3.0) is None      # 2.5 s unanswered
    assert s.observe(1000, 1400, 3.5) == 3.0       # 3 s unanswered: dead


def test_an_answer_clears_the_pending_send():
    s = Silence(after=3.0)
    s.observe(1000, 1000, 0.0)
    s.observe(1000, 1200, 0.5)
    assert s.observe(1100, 1300, 1.0) is None      # answered
    assert s.observe(1100, 1300, 10.0) is None     # nothing sent since: idle, not dead


def test_keepalives_alone_never_make_a_peer_dead():
    """An idle tunnel: the node's persistent keepalive (32 bytes) every 25 s, nothing back."""
    s = Silence(after=3.0)
    s.observe(500, 500, 0.0)
    tx = 500
    for i in range(1, 600):                        # five minutes of looks every 0.5 s
        if i % 50 == 0:
            tx += 32
        if i % 240 == 0:                           # now and then a keepalive and a nudge in one look
            tx += 64
        assert s.observe(500, tx, i * 0.5) is None


def test_counters_that_restart_only_move_the_baseline():
    s = Silence(after=3.0)
    s.observe(1000, 1000, 0.0)
    s.observe(1000, 1200, 0.5)
    assert s.observe(0, 148, 1.0) is None          # the peer was re-added: not an answer, not a send
    assert s.observe(0, 148, 9.0) is None
    assert s.observe(0, 400, 9.5) is None          # a new send after the restart
    assert s.observe(0, 400, 12.5) == 3.0


class Fake:
    """Counters and a reset that heals on the ``heal_on``-th attempt."""

    def __init__(self, heal_on: int, wait: bool = True) -> None:
        self.rx, self.tx, self.resets, self.heal_on, self.wait, self.age = 0, 0, 0, heal_on, wait, None

    async def counters(self) -> dict[str, Counters]:
        return {"gw": Counters(self.rx, self.tx, self.age)}

    async def reset(self, within: float) -> bool:
        self.resets += 1
        healed = self.resets >= self.heal_on
        if healed:
            self.rx += 92                              # the handshake response
            self.age = 0.0
        if self.wait and not healed:
            await asyncio.sleep(within)
        return healed and self.wait


def recovered(watch: DeadPeerWatch) -> bool:
    return bool(watch.events) and watch.events[0]["recovered_after"] is not None


async def _run(watch: DeadPeerWatch, fake: Fake, sending: bool, seconds: float = 0.0, until=None) -> None:
    """Run the watch over ``fake`` for ``seconds`` (nothing should happen), or ``until`` it holds
    (within a generous deadline: a busy machine only makes it take longer)."""
    async def traffic():
        while True:
            await asyncio.sleep(0.01)
            if sending:
                fake.tx += 100
    t = asyncio.create_task(traffic())
    task = asyncio.create_task(watch.run(fake.counters, fake.reset))
    if until is not None:
        await wait_until(until, what="the watch's recovery")
    else:
        await asyncio.sleep(seconds)
    task.cancel()
    t.cancel()
    await asyncio.gather(task, t, return_exceptions=True)


def test_a_silent_gateway_gets_fresh_handshakes_until_it_answers():
    fake = Fake(heal_on=3)
    watch = DeadPeerWatch(after=0.2, check_every=0.02, retry=0.05)
    asyncio.run(_run(watch, fake, sending=True, until=lambda: recovered(watch)))
    assert watch.detections >= 1 and fake.resets >= 3
    first = watch.events[0]
    assert first["attempts"] == 3 and first["recovered_after"] is not None
    assert "nothing received" in first["reason"]
    assert "handshake again after" in watch.last()
    assert watch.report()["detections"] == watch.detections


def test_an_engine_that_does_not_wait_is_judged_by_its_next_handshake_and_reset_less_often():
    fake = Fake(heal_on=3, wait=False)             # wireproxy: reset restarts the process, returns False
    watch = DeadPeerWatch(after=0.2, check_every=0.02, retry=0.05, retry_slow=0.3)
    asyncio.run(_run(watch, fake, sending=True, until=lambda: recovered(watch)))
    assert watch.events and watch.events[0]["recovered_after"] is not None and watch.events[0]["attempts"] == 3
    assert watch.events[0]["recovered_after"] >= 0.6  # every retry_slow, not every retry: no restart storm


def test_an_idle_tunnel_is_left_alone():
    fake = Fake(heal_on=1)
    watch = DeadPeerWatch(after=0.2, check_every=0.02, retry=0.05)
    asyncio.run(_run(watch, fake, sending=False, seconds=0.5))
    assert fake.resets == 0 and watch.detections == 0 and watch.last() == ""


A, B = "A" * 43 + "=", "B" * 43 + "="


@pytest.fixture
async def tasks():
    async with asyncio.TaskGroup() as group:
        yield Tasks(group, role="test", base=0.05, cap=0.2)
        for task in list(group._tasks):
            task.cancel()


def _desired(*peers: PeerConfig) -> DesiredConfig:
    return DesiredConfig(private_key=generate_private_key(), listen_port=None, address="10.254.0.7/16", mtu=1380,
                         peers=peers, routes=("10.77.0.0/24",))


def test_assign_gives_each_network_to_one_gateway_in_order_and_moves_a_demoted_one_s_away():
    a = PeerConfig(A, "192.0.2.1:51820", ("10.254.0.0/16", "10.77.0.0/24", "10.88.0.0/24", "10.254.0.1/32"), 25)
    b = PeerConfig(B, "192.0.2.2:51820", ("10.254.0.0/16", "10.77.0.0/24", "10.254.0.2/32"), 25)
    desired = _desired(a, b)
    both = assign(desired)  # nothing demoted: the first gateway carries what both offer
    assert both.peers[0] == a
    assert both.peers[1].allowed_ips == ("10.254.0.2/32",)  # a standby keeps its own address
    moved = assign(desired, frozenset({A}))
    assert moved.peers[0].allowed_ips == ("10.88.0.0/24", "10.254.0.1/32")  # only A offers these: it keeps them
    assert moved.peers[1] == b
    assert assign(desired, frozenset({B})) == both
    assert assign(desired, frozenset({A, B})) == both  # nobody left to take the traffic: as if none were demoted
    alone = _desired(a)
    assert assign(alone) is alone and assign(alone, frozenset({A})) is alone


async def test_the_engine_holds_what_assign_gives_it_whichever_gateway_carries(tasks):
    """The failure assign prevents: two peers listing one network left the engine with the
    last one written (the live gateway showing none); assigned, each write holds."""
    from anex_agent.tunnels.engines.userspace import UserspaceEngine

    ka, kb = (encode_key(public_key(generate_private_key())) for _ in range(2))
    a = PeerConfig(ka, "127.0.0.1:9", ("10.254.0.0/16", "10.77.0.0/24", "10.254.0.1/32"), 0)
    b = PeerConfig(kb, "127.0.0.1:9", ("10.254.0.0/16", "10.77.0.0/24", "10.254.0.2/32"), 0)
    engine = UserspaceEngine(ifname=None)
    await engine.start(tasks)
    try:
        for demoted in (frozenset(), frozenset({ka}), frozenset()):
            desired = assign(_desired(a, b), demoted)
            await engine.apply(desired)
            held = {p.public_key: set(p.allowed_ips) for p in (await engine.status()).peers}
            assert held == {p.public_key: p.allowed_set() for p in desired.peers}, demoted
        assert held[ka] == {"10.254.0.0/16", "10.77.0.0/24", "10.254.0.1/32"}
    finally:
        await engine.stop()


class TwoGateways:
    """A carries the traffic and goes silent; B is an idle standby that handshook recently.
    Handshake ages grow with the clock, as an engine's do (a constant age would read as a fresh
    handshake once more than that age has passed)."""

    def __init__(self) -> None:
        now = time.monotonic()
        self.c = {A: [1000, 1000], B: [500, 500]}
        self.handshook = {A: now - 1.0, B: now - 30.0}
        self.steered: list[frozenset[str]] = []
        self.resets = 0
        self.looks = 0  # how many times the watch read the counters

    async def counters(self) -> dict[str, Counters]:
        self.looks += 1
        now = time.monotonic()
        return {k: Counters(rx, tx, now - self.handshook[k]) for k, (rx, tx) in self.c.items()}

    async def reset(self, within: float) -> bool:
        self.resets += 1
        return False

    async def steer(self, demoted: frozenset[str]) -> bool:
        self.steered.append(demoted)
        return True


def test_a_silent_gateway_s_traffic_moves_to_one_that_answers_and_back():
    gws = TwoGateways()
    watch = DeadPeerWatch(after=0.2, check_every=0.02, retry=0.05)

    async def scenario():
        task = asyncio.create_task(watch.run(gws.counters, gws.reset, gws.steer))

        async def a_gets_data_and_never_answers():
            gws.c[A][1] += 300
            await asyncio.sleep(0.02)
            return gws.steered

        await wait_until(a_gets_data_and_never_answers, what="the traffic moving off the silent gateway")
        assert gws.steered == [frozenset({A})] and gws.resets == 0
        assert watch.demoted.keys() == {A} and "traffic moved to gateway BBBBBBBB" in watch.last()
        looks = gws.looks
        while gws.looks < looks + 10:  # B carries it now; A is only retried
            gws.c[B][0] += 200
            gws.c[B][1] += 200
            gws.c[A][1] += 148
            await asyncio.sleep(0.02)
        assert gws.steered == [frozenset({A})]     # no second failover for a demoted gateway
        gws.handshook[A] = time.monotonic()        # A handshook again
        await wait_until(lambda: gws.steered[-1] == frozenset() and not watch.demoted, what="A taking its traffic back")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())



def test_a_silent_gateway_s_traffic_moves_after_half_the_dead_peer_time_a_lone_one_waits_it_all():
    watch = DeadPeerWatch(after=2.0)
    assert watch.fail_over_after == 1.0
    looks = [(0.0, 1000), (0.5, 1300), (1.0, 1600), (1.5, 1900), (2.0, 2200), (2.5, 2500)]
    standby = Counters(500, 500, 30.0)
    verdicts = [watch.judge({A: Counters(1000, tx, 1.0), B: standby}, t, can_steer=True) for t, tx in looks[:4]]
    assert verdicts[:3] == [None, None, None] and verdicts[3] == ({A: 1.0}, [B])  # 1 s after the first send
    lone = DeadPeerWatch(after=2.0)
    verdicts = [lone.judge({A: Counters(1000, tx, 1.0)}, t, can_steer=True) for t, tx in looks]
    assert verdicts[:5] == [None] * 5 and verdicts[5] == ({A: 2.0}, [])  # no one to move to: handshakes at 2 s
    stale = DeadPeerWatch(after=2.0)  # a standby that has not handshaken for long is no refuge
    verdicts = [stale.judge({A: Counters(1000, tx, 1.0), B: Counters(500, 500, 400.0)}, t, can_steer=True)
                for t, tx in looks]
    assert verdicts[3] is None and verdicts[5] == ({A: 2.0}, [])


def test_a_carrying_gateway_that_never_handshook_is_silent_when_another_answers():
    """What goes to a gateway without a session waits for a handshake WireGuard retries every
    5 s, and no byte is counted meanwhile: 1 s without a session is enough when another answers."""
    watch = DeadPeerWatch(after=2.0)
    standby = Counters(500, 500, 30.0)
    verdicts = [watch.judge({A: Counters(0, 148, None), B: standby}, t, can_steer=True) for t in (0.0, 0.5, 1.0)]
    assert verdicts == [None, None, ({A: 1.0}, [B])] and watch.sessionless == {A}
    lone = DeadPeerWatch(after=2.0)  # nobody to move to: WireGuard's own retries, no fresh handshakes of ours
    assert [lone.judge({A: Counters(0, 148, None)}, t, can_steer=True) for t in (0.0, 1.0, 5.0)] == [None] * 3
    fresh = DeadPeerWatch(after=2.0)  # a handshake in time: nothing to do
    assert fresh.judge({A: Counters(0, 148, None), B: standby}, 0.0, can_steer=True) is None
    assert fresh.judge({A: Counters(92, 240, 0.1), B: standby}, 0.5, can_steer=True) is None
    assert fresh.judge({A: Counters(92, 240, 0.6), B: standby}, 1.5, can_steer=True) is None


def test_a_send_right_after_the_traffic_moved_is_not_taken_for_the_baseline():
    watch = DeadPeerWatch(after=2.0)
    standby = Counters(500, 500, 1.0)
    watch.demoted[A] = 0.0
    watch.rebase({A: Counters(92, 180, 0.2), B: standby})  # A answered again; its traffic went back to it
    del watch.demoted[A]
    # a DNS query went to A (then it died) before the next look: that look must count it
    assert watch.judge({A: Counters(92, 404, 0.4), B: standby}, 10.0, can_steer=True) is None
    assert watch.judge({A: Counters(92, 404, 0.9), B: standby}, 11.0, can_steer=True) == ({A: 1.0}, [B])
