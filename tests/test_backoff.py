"""The one retry delay: exponential, capped, equal jitter (``[d/2, d]``), or none when asked."""

from __future__ import annotations

import random

import pytest

from anex_agent.backoff import Backoff


def test_the_delay_grows_with_equal_jitter_and_caps():
    b = Backoff(base=1, cap=8, rng=random.Random(1))
    delays = [b.next_delay() for _ in range(8)]
    for i, d in enumerate(delays):
        ceiling = min(8, 2**i)
        assert ceiling / 2 <= d <= ceiling
    assert b.attempts == 8
    b.reset()
    assert b.attempts == 0 and 0.5 <= b.next_delay() <= 1


def test_the_jitter_spreads_a_fleet_over_the_upper_half_of_the_ceiling():
    delays = [Backoff(base=4, cap=4, rng=random.Random(seed)).next_delay() for seed in range(200)]
    assert min(delays) >= 2 and max(delays) <= 4
    assert len({round(d, 3) for d in delays}) > 100  # spread, not one value
    assert min(delays) < 2.2 and max(delays) > 3.8  # over the whole half


def test_delay_of_an_attempt_counts_nothing_and_follows_the_factor():
    b = Backoff(base=2, cap=100, factor=1.5, jitter=False)
    assert [b.delay(n) for n in range(4)] == [2, 3, 4.5, 6.75]
    assert b.attempts == 0
    assert b.delay(10_000) == 100 and b.ceiling(-1) == 2


def test_without_jitter_the_delay_is_the_ceiling():
    b = Backoff(base=10, cap=300, jitter=False)
    assert [b.next_delay() for _ in range(7)] == [10, 20, 40, 80, 160, 300, 300]


def test_a_seeded_rng_repeats_and_none_draws_a_fresh_one():
    first = [Backoff(rng=random.Random(5)).delay(n) for n in range(5)]
    assert first == [Backoff(rng=random.Random(5)).delay(n) for n in range(5)]
    b = Backoff(base=1, cap=1)
    assert 0.5 <= b.delay(0) <= 1


@pytest.mark.parametrize("options", [{"base": -1}, {"cap": -0.5}, {"factor": 0.5}])
def test_a_shrinking_or_negative_backoff_is_refused(options):
    with pytest.raises(ValueError, match="backoff needs"):
        Backoff(**options)
