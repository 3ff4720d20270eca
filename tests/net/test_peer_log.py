"""What a peer sent, in a log line: bounded, escaped; refusals logged within a budget."""

from __future__ import annotations

from anex_agent.net.peer_log import LogBudget, peer_text


def test_printable_text_is_kept_and_everything_else_escaped():
    assert peer_text("GET /status") == "GET /status"
    assert peer_text("a\nINFO forged line\r\x1b[31m\x9b\u202e\\") == "a\\nINFO forged line\\r\\x1b[31m\\x9b\\u202e\\\\"
    assert peer_text(b"\x00ok\xff") == "\\x00ok\\xff"
    assert peer_text(None) == "-"


def test_a_long_value_is_cut_and_the_rest_counted():
    shown = peer_text("A" * 8000, limit=96)
    assert shown == "A" * 96 + "...(7904 more)"
    assert len(peer_text(b"\n" * 100_000)) < 96 * 2 + 20  # escaped: two characters each, still bounded


def test_the_budget_lets_a_burst_through_then_counts_what_it_held_back():
    now = [0.0]
    budget = LogBudget(burst=2, interval=60.0, clock=lambda: now[0])
    assert [budget.take() for _ in range(5)] == [0, 0, None, None, None]
    now[0] = 60.0
    assert budget.take() == 3  # the first line of the next minute says how many were not logged
    assert budget.take() == 0 and budget.take() is None
