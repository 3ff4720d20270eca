"""The provisioning scheduler's retry delays after a failed step (a provider unavailable): one
:class:`anex_agent.backoff.Backoff` per provision, with its jitter, ``Retry-After`` as a floor, started
over once the provision moves on. The scheduling itself is driven through the provisioning routes
(tests/coordinator/test_provisioning.py, test_provisioning_recovery.py)."""

from __future__ import annotations

import random

from anex_agent.coordinator.provisioning.config import ProvisioningSettings
from anex_agent.coordinator.provisioning.scheduler import Provisioner, RetryDelays


def test_delays_double_up_to_the_cap_with_equal_jitter():
    delays = RetryDelays(2.0, 60.0, rng=random.Random(7))
    for ceiling in (2, 4, 8, 16, 32, 60, 60, 60):
        assert ceiling / 2 <= delays.next("p_1") <= ceiling


def test_provisions_that_failed_together_do_not_come_back_together():
    delays = RetryDelays(2.0, 60.0, rng=random.Random(7))
    first = [delays.next(f"p_{i}") for i in range(20)]
    assert all(1.0 <= d <= 2.0 for d in first)
    assert len(set(first)) == 20  # jittered: not one wave of retries


def test_retry_after_is_a_floor_and_each_provision_has_its_own_count():
    delays = RetryDelays(2.0, 60.0, rng=random.Random(7))
    assert delays.next("p_1", retry_after=45.0) == 45.0
    assert 2.0 <= delays.next("p_1", retry_after=0.5) <= 4.0  # the count went on underneath
    assert 1.0 <= delays.next("p_2") <= 2.0


def test_a_provision_that_moved_on_starts_over():
    delays = RetryDelays(2.0, 60.0, rng=random.Random(7))
    for _ in range(5):
        delays.next("p_1")
    delays.reset("p_1")
    assert 1.0 <= delays.next("p_1") <= 2.0
    delays.reset("p_unknown")  # nothing to forget: no error


def test_the_loop_uses_the_settings_backoff_and_a_move_starts_the_delays_over():
    settings = ProvisioningSettings(backoff=3.0, backoff_max=10.0)
    loop = Provisioner(object(), providers={}, selector=None, issuer=None, settings=settings)
    assert (loop.retry_delays.base, loop.retry_delays.cap) == (3.0, 10.0)
    for _ in range(4):
        loop.retry_delays.next("p_1")
    loop.transitions.progressed("p_1")  # what every state change and recorded rental calls
    assert 1.5 <= loop.retry_delays.next("p_1") <= 3.0
