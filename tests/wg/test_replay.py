"""Replay window edge cases (RFC 6479 behaviour, 2048-counter window)."""

import pytest

from anex_agent.wg.constants import REJECT_AFTER_MESSAGES, REPLAY_WINDOW
from anex_agent.wg.replay import ReplayWindow


def test_in_order():
    w = ReplayWindow()
    assert all(w.check(i) for i in range(5000))
    assert w.highest == 4999


def test_duplicate_refused():
    w = ReplayWindow()
    assert w.check(0) and not w.check(0)
    assert w.check(10) and not w.check(10)


def test_out_of_order_within_window_accepted_once():
    w = ReplayWindow()
    assert w.check(100)
    for c in (99, 50, 1, 0, 98):
        assert w.check(c)
        assert not w.check(c)
    assert w.highest == 100


def test_window_edges():
    w = ReplayWindow()
    top = 10_000
    assert w.check(top)
    oldest_ok = top - (REPLAY_WINDOW - 1)
    assert not w.check(oldest_ok - 1)  # just outside
    assert w.check(oldest_ok)  # just inside
    assert not w.check(oldest_ok)


def test_window_jump_clears_old_marks_but_not_position():
    w = ReplayWindow()
    for c in range(10):
        assert w.check(c)
    assert w.check(9 + REPLAY_WINDOW * 3)  # far jump
    assert not w.check(9)  # now too old
    assert w.check(9 + REPLAY_WINDOW * 3 - 1)  # fresh, just below the new top
    # a jump smaller than the window keeps earlier marks
    w2 = ReplayWindow()
    assert w2.check(5) and w2.check(5 + REPLAY_WINDOW - 10)
    assert not w2.check(5) and w2.check(6)


def test_would_accept_does_not_record():
    w = ReplayWindow()
    assert w.would_accept(3) and w.would_accept(3)
    assert w.check(3) and not w.would_accept(3)


@pytest.mark.parametrize("counter", [REJECT_AFTER_MESSAGES, REJECT_AFTER_MESSAGES + 1, 2**64 - 1, -1])
def test_counters_beyond_the_limit_are_refused(counter):
    assert not ReplayWindow().check(counter)
