"""The virtual node's work queue: a key once in the queue, one worker at a time, again when re-added."""

from __future__ import annotations

import asyncio

from anex_agent.virtualnode.workqueue import WorkQueue


async def test_a_key_is_queued_once_and_again_after_it_was_re_added_while_processing():
    queue = WorkQueue()
    queue.add("a")
    queue.add("a")
    queue.add("b")
    assert len(queue) == 2
    key = await queue.get()
    assert key == "a"
    queue.add("a")  # changed while being synced: not handed to a second worker now
    assert await queue.get() == "b" and len(queue) == 0
    queue.done("a")  # ... but synced again afterwards
    assert await asyncio.wait_for(queue.get(), 1) == "a"


async def test_add_after_queues_later_and_close_cancels():
    queue = WorkQueue()
    queue.add_after("a", 0.01)
    assert await asyncio.wait_for(queue.get(), 5) == "a"
    queue.add_after("b", 3600)
    queue.close()
    assert len(queue) == 0
