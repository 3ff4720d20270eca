"""The selection thread (inside the selection worker process): runs jobs off the loop, with the collector paused and a short
GIL switch interval, and restores both."""

from __future__ import annotations

import gc
import sys
import threading

import pytest

from anex_agent.selection import threads


async def test_jobs_run_on_the_selection_thread_with_the_collector_paused():
    seen = {}

    def job(x, *, y):
        seen.update(thread=threading.current_thread().name, gc=gc.isenabled(), interval=sys.getswitchinterval())
        return x + y

    interval = sys.getswitchinterval()
    assert gc.isenabled()
    assert await threads.run(job, 1, y=2) == 3
    assert seen["thread"].startswith(threads.THREAD_NAME) and seen["thread"] != threading.current_thread().name
    assert seen["gc"] is False and seen["interval"] == pytest.approx(threads.SWITCH_INTERVAL)
    assert gc.isenabled() and sys.getswitchinterval() == interval  # restored


async def test_a_failing_job_raises_here_and_restores_everything():
    def job():
        raise KeyError("boom")

    interval = sys.getswitchinterval()
    with pytest.raises(KeyError):
        await threads.run(job)
    assert gc.isenabled() and sys.getswitchinterval() == interval


async def test_a_collector_disabled_by_someone_else_stays_disabled():
    gc.disable()
    try:
        await threads.run(lambda: None)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_table_keeps_no_object_per_offer_and_rebuilds_rows_on_demand():
    """Live Offer objects would make every full collection walk them all (a process-wide stall)."""
    from anex_agent.selection.offers import Offer, OfferTable

    gc.collect()
    gc.freeze()  # what lived before is set aside: the collection and the counts walk only what came after
    try:
        before = sum(isinstance(o, Offer) for o in gc.get_objects())
        table = OfferTable(Offer(provider="vastai", offer_id=str(i), gpu_name="RTX 4090", price=i / 10,
                                 details={"reliability": 0.99}) for i in range(2000))
        gc.collect()
        assert sum(isinstance(o, Offer) for o in gc.get_objects()) == before
    finally:
        gc.unfreeze()
    row = table.offers[1234]
    assert (row.offer_id, row.price, row.gpu_name, row.details, row.gpu_key) == ("1234", 123.4, "RTX 4090",
                                                                                 {"reliability": 0.99}, "rtx 4090")
    assert len(table.offers) == 2000 and [o.offer_id for o in table.offers[:3]] == ["0", "1", "2"]
    assert table.offers[-1].offer_id == "1999"
    with pytest.raises(IndexError):
        table.offers[2000]
