"""The heartbeats around a workload's run (``anex_agent.agent.heartbeat``): one as it starts,
so that the coordinator hears of the node before a short workload can end (a provision becomes
ready on the node's first heartbeat; one never heard of is rented again when its deadline
passes), and the last one, which waits longer while nothing of this run was acknowledged."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from anex_agent.agent import heartbeat
from anex_agent.agent.state import NodeIdentity
from anex_agent.errors import CoordinatorError
from anex_agent.wire.heartbeat import TransportStatus


class Link:
    """The coordinator link's heartbeat call: answers, fails, or never answers."""

    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.sent: list = []

    async def heartbeat(self, node_id, beat):
        self.sent.append((node_id, beat))
        if self.behaviour == "fail":
            raise CoordinatorError("connection refused", retryable=True)
        if self.behaviour == "hang":
            await asyncio.Event().wait()
        return SimpleNamespace(credential=None)


class DataPlane:
    config = None

    async def transport_status(self) -> TransportStatus:
        return TransportStatus(engine="userspace", path="udp")


def agent(link: Link) -> SimpleNamespace:
    return SimpleNamespace(identity=NodeIdentity("http://c", "n-1", "cred"), dataplane=DataPlane(), link=link,
                           workload=None, telemetry=None, last_transport=None, credential_revoked=None,
                           heartbeat_acked=False)


async def test_the_first_heartbeat_is_sent_without_waiting_for_telemetry_and_marks_the_run_heard():
    node = agent(Link("answer"))
    assert await heartbeat.first_heartbeat(node) is True
    assert [n for n, _ in node.link.sent] == ["n-1"] and node.heartbeat_acked


async def test_a_first_heartbeat_that_fails_leaves_the_run_unheard():
    node = agent(Link("fail"))
    assert await heartbeat.first_heartbeat(node) is False
    assert not node.heartbeat_acked


async def test_the_last_heartbeat_waits_longer_while_nothing_of_this_run_was_heard():
    node = agent(Link("hang"))
    assert heartbeat.last_heartbeat_timeout(node) == heartbeat.UNHEARD_LAST_HEARTBEAT_TIMEOUT
    node.heartbeat_acked = True
    assert heartbeat.last_heartbeat_timeout(node) == heartbeat.LAST_HEARTBEAT_TIMEOUT
    assert heartbeat.LAST_HEARTBEAT_TIMEOUT < heartbeat.UNHEARD_LAST_HEARTBEAT_TIMEOUT


async def test_the_last_heartbeat_is_bounded_when_the_coordinator_never_answers():
    node = agent(Link("hang"))
    assert await heartbeat.last_heartbeat(node, timeout=0.01) is False  # bounded: the exit is never held
    assert len(node.link.sent) == 1 and not node.heartbeat_acked
