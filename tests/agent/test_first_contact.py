"""Extra initiations to a gateway just named, until it answers (anex_agent/agent/first_contact.py)."""

from __future__ import annotations

from anex_agent.agent.first_contact import FIRST_RETRY, RETRY_CAP, FirstContact


class Fake:
    """A fake clock and sleep, and a gateway set that answers after ``answers_after`` asks."""

    def __init__(self, answers_after: int | None) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []
        self.asks: list[frozenset[str]] = []
        self.answers_after = answers_after

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    async def handshaken(self) -> set[str]:
        if self.answers_after is not None and len(self.asks) >= self.answers_after:
            return {"gw-a"}
        return set()

    async def ask(self, keys: frozenset[str]) -> None:
        self.asks.append(keys)


async def test_asks_with_a_growing_delay_until_the_gateway_answers():
    fake = Fake(answers_after=4)
    contact = FirstContact(clock=fake.clock)
    assert contact.add(["gw-a"]) and not contact.add(["gw-a"])
    answers = []
    await contact.run(fake.handshaken, fake.ask, fake.sleep, lambda: answers.append(fake.now))
    assert answers == [fake.now]  # once, when the answer came: connection attempts start again
    assert fake.asks == [frozenset({"gw-a"})] * 4  # and none after the answer
    assert contact.asked == {"gw-a": 4} and not contact.waiting and "gw-a" in contact.answered
    assert all(s <= RETRY_CAP for s in fake.sleeps) and fake.sleeps[0] <= FIRST_RETRY < max(fake.sleeps)
    assert sum(fake.sleeps[:3]) < 5.0  # three extra initiations before WireGuard's own retry would come


async def test_gives_up_after_its_window_and_leaves_the_rest_to_wireguard():
    fake = Fake(answers_after=None)
    contact = FirstContact(clock=fake.clock, retry_for=10.0)
    contact.add(["gw-a"])
    await contact.run(fake.handshaken, fake.ask, fake.sleep)
    assert not contact.waiting and "gw-a" not in contact.answered
    assert 5 <= len(fake.asks) <= 10 / (RETRY_CAP / 2) + 5  # a few a second at first, then RETRY_CAP apart


async def test_a_gateway_with_a_session_is_not_asked_for():
    fake = Fake(answers_after=0)
    contact = FirstContact(clock=fake.clock)
    contact.add(["gw-a"])
    answers = []
    await contact.run(fake.handshaken, fake.ask, fake.sleep, lambda: answers.append(fake.now))
    assert fake.asks == [] and contact.asked == {"gw-a": 0} and answers == []
