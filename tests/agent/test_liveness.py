"""Dead-peer detection (anex_agent.agent.liveness): pure rules and the watch loop with fakes."""

from __future__ import annotations

import asyncio

from anex_agent.agent.liveness import DeadPeerWatch, Silence
from anex_agent.agent.path import Counters


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

    async def counters(self) -> Counters:
        return Counters(self.rx, self.tx, self.age)

    async def reset(self, within: float) -> bool:
        self.resets += 1
        healed = self.resets >= self.heal_on
        if healed:
            self.rx += 92                              # the handshake response
            self.age = 0.0
        if self.wait and not healed:
            await asyncio.sleep(within)
        return healed and self.wait


async def _run(watch: DeadPeerWatch, fake: Fake, sending: bool, seconds: float) -> None:
    async def traffic():
        while True:
            await asyncio.sleep(0.01)
            if sending:
                fake.tx += 100
    t = asyncio.create_task(traffic())
    task = asyncio.create_task(watch.run(fake.counters, fake.reset))
    await asyncio.sleep(seconds)
    task.cancel()
    t.cancel()
    await asyncio.gather(task, t, return_exceptions=True)


def test_a_silent_gateway_gets_fresh_handshakes_until_it_answers():
    fake = Fake(heal_on=3)
    watch = DeadPeerWatch(after=0.2, check_every=0.02, retry=0.05)
    asyncio.run(_run(watch, fake, sending=True, seconds=0.6))
    assert watch.detections >= 1 and fake.resets >= 3
    first = watch.events[0]
    assert first["attempts"] == 3 and first["recovered_after"] is not None
    assert "nothing received" in first["reason"]
    assert "handshake again after" in watch.last()
    assert watch.report()["detections"] == watch.detections


def test_an_engine_that_does_not_wait_is_judged_by_its_next_handshake_and_reset_less_often():
    fake = Fake(heal_on=3, wait=False)             # wireproxy: reset restarts the process, returns False
    watch = DeadPeerWatch(after=0.2, check_every=0.02, retry=0.05, retry_slow=0.3)
    asyncio.run(_run(watch, fake, sending=True, seconds=1.2))
    assert watch.events and watch.events[0]["recovered_after"] is not None and watch.events[0]["attempts"] == 3
    assert watch.events[0]["recovered_after"] >= 0.6  # every retry_slow, not every retry: no restart storm


def test_an_idle_tunnel_is_left_alone():
    fake = Fake(heal_on=1)
    watch = DeadPeerWatch(after=0.2, check_every=0.02, retry=0.05)
    asyncio.run(_run(watch, fake, sending=False, seconds=0.5))
    assert fake.resets == 0 and watch.detections == 0 and watch.last() == ""
