"""What handshake work a stranger can make the device do: WireGuard's under-load defences
(whitepaper §5.3) sized for one Python event loop that also carries the data.

A handshake initiation with a valid mac1 proves only that its sender knows our public key,
which is public. Answering one costs Diffie-Hellman work (hundreds of µs in Python), a cookie
reply tens of µs; a flood of them at line rate would take the loop from the sessions' data.
So, per device:

* **Load**: the device is *under load* while more than ``UNDER_LOAD_HANDSHAKES_PER_SECOND``
  handshake messages arrived within a second (held for ``UNDER_LOAD_HOLD`` s), or while the
  backlog below is an eighth full (wireguard-go's test on its handshake queue).
* **Per source** (under load): every handshake message of one source address (an IPv4
  address, an IPv6 /64) takes a token of :class:`anex_agent.wg.ratelimit.RateLimiter`
  (20/s, bursts of 5), cookie replies included: one address cannot spend the budgets below.
* **Cookie replies** (under load, no valid mac2): at most ``COOKIE_REPLIES_PER_SECOND`` in
  all (bursts of ``COOKIE_REPLY_BURST``); past it a message is dropped.
* **Diffie-Hellman work** (initiations): at most ``HANDSHAKE_WORK_PER_SECOND`` in all (bursts
  of ``HANDSHAKE_WORK_BURST``). Under load every initiation that passed mac2 waits in a
  bounded *backlog* (``HANDSHAKE_BACKLOG``; full: dropped) and is worked in
  :meth:`Device.update_timers`, at most ``HANDSHAKES_PER_TURN`` per call, so the datagrams of
  established sessions that arrive in the same event-loop turn are decrypted first; the
  device's ``next_deadline`` says when the backlog can be worked (now, or when the next
  token comes). Not under load, an initiation is worked at once while a token is left.
  A waiting initiation older than ``BACKLOG_MAX_AGE`` is dropped: its sender has retried.

Pure: ``now`` comes from the caller, nothing here reads a clock.
"""

from __future__ import annotations

import ipaddress
from collections import deque
from collections.abc import Hashable
from typing import Any

from anex_agent.wg.constants import REKEY_TIMEOUT, UNDER_LOAD_HANDSHAKES_PER_SECOND, UNDER_LOAD_HOLD
from anex_agent.wg.ratelimit import RateLimiter

#: Initiations waiting for Diffie-Hellman work (wireguard-go: QueueHandshakeSize = 1024, with
#: parallel workers; one Python loop works far fewer a second).
HANDSHAKE_BACKLOG = 128
#: Initiations worked per update_timers() call: the rest waits for the next event-loop turn.
HANDSHAKES_PER_TURN = 4
#: Initiations worked per second in all, and the burst (a node handshakes with a few gateways).
HANDSHAKE_WORK_PER_SECOND = 200.0
HANDSHAKE_WORK_BURST = 32
#: Cookie replies per second in all under load, and the burst.
COOKIE_REPLIES_PER_SECOND = 500.0
COOKIE_REPLY_BURST = 64
#: A waiting initiation this old is dropped (its sender retries after REKEY_TIMEOUT, §6.4).
BACKLOG_MAX_AGE = REKEY_TIMEOUT


class TokenBucket:
    """``rate`` tokens a second up to ``burst``; starts full."""

    __slots__ = ("rate", "burst", "tokens", "updated")

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self.updated = float("-inf")

    def _refill(self, now: float) -> None:
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate) if now > self.updated else self.tokens
        self.updated = max(self.updated, now)

    def take(self, now: float) -> bool:
        """Take a token; False when none is left."""
        self._refill(now)
        if self.tokens < 1.0 - 1e-9:  # at ready_at() a token is there, rounding aside
            return False
        self.tokens -= 1.0
        return True

    def ready_at(self) -> float:
        """When the next token is there (a time already past when one is)."""
        if self.tokens >= 1.0 - 1e-9:
            return self.updated
        return self.updated + (1.0 - self.tokens) / self.rate


def source_of(endpoint: Hashable) -> Hashable:
    """The per-source key of an endpoint: the host of an ``(ip, port)`` tuple (an IPv6 address
    by its /64, one host's share), the endpoint itself otherwise (a relay connection's id)."""
    if isinstance(endpoint, tuple) and endpoint and isinstance(endpoint[0], str):
        host = endpoint[0]
        if ":" in host:
            try:
                return ipaddress.IPv6Address(host).packed[:8]
            except ValueError:
                return host
        return host
    return endpoint


class HandshakeBudget:
    """The device's load estimate, per-source limiter, work and cookie budgets and backlog (see the module)."""

    def __init__(self) -> None:
        self.per_source = RateLimiter()
        self.work = TokenBucket(HANDSHAKE_WORK_PER_SECOND, HANDSHAKE_WORK_BURST)
        self.cookies = TokenBucket(COOKIE_REPLIES_PER_SECOND, COOKIE_REPLY_BURST)
        self.backlog: deque[tuple[float, Any, Hashable]] = deque()  # (arrived, message, endpoint)
        self.force_under_load: bool | None = None
        self._window_start = float("-inf")
        self._window_count = 0
        self._under_load_until = float("-inf")

    def arrived(self, now: float) -> bool:
        """Count one handshake message arriving at ``now``; True while the device is under load."""
        if self.force_under_load is not None:
            return self.force_under_load
        if now - self._window_start >= 1.0:
            self._window_start, self._window_count = now, 0
        self._window_count += 1
        if self._window_count > UNDER_LOAD_HANDSHAKES_PER_SECOND or len(self.backlog) >= HANDSHAKE_BACKLOG // 8:
            self._under_load_until = now + UNDER_LOAD_HOLD
        return now < self._under_load_until

    def loaded(self, now: float) -> bool:
        """Whether the device is under load at ``now`` (counts nothing)."""
        if self.force_under_load is not None:
            return self.force_under_load
        return now < self._under_load_until

    def source_allows(self, endpoint: Hashable, now: float) -> bool:
        return self.per_source.allow(source_of(endpoint), now)

    def defer(self, message: Any, endpoint: Hashable, now: float) -> bool:
        """Queue an initiation for later work; False when the backlog is full."""
        if len(self.backlog) >= HANDSHAKE_BACKLOG:
            return False
        self.backlog.append((now, message, endpoint))
        return True

    def due(self) -> float | None:
        """When the backlog can next be worked (None: it is empty)."""
        if not self.backlog:
            return None
        return max(self.work.ready_at(), self.backlog[0][0])  # never before the oldest arrived
