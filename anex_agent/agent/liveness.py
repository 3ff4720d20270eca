"""Dead-peer detection: the node sent to its gateways and heard nothing back; handshake again now.

A gateway that restarted has no session and, the node being behind NAT, does not know where
the node is: nothing happens until the node's WireGuard timers give up on the old session
(REKEY_TIMEOUT + KEEPALIVE_TIMEOUT, whitepaper §6.1/§6.5: about 15 s). The agent does not
wait for them, nor for the coordinator: when it has **sent data** to the gateways and
**received nothing** (no data, no keepalive, no handshake response) for ``after`` s
(``ANEX_DEAD_PEER_AFTER``, default :data:`DEAD_AFTER`, the path watcher's stall time), it starts a
new handshake at once
(:meth:`anex_agent.tunnels.base.Engine.reset_sessions`, every engine) and repeats it every
:data:`RETRY` s until a handshake completes (every :data:`RETRY_SLOW` s once the gateways
have been silent for :data:`FAST_FOR` s, and always for an engine whose reset does not wait
for the handshake: wireproxy restarts its process), so traffic is back about a second after
the gateway is.

The signal is the one the path watcher uses (:mod:`anex_agent.agent.path`): the engine's
receive and send counters summed over the gateway peers, read every :data:`CHECK_EVERY` s.
"Sent data" means more than :data:`KEEPALIVE_ONLY` bytes went out between two looks: a
keepalive is 32 bytes (an empty transport message, whitepaper §5.4.6), so the node's
persistent keepalives on an idle tunnel (the gateway sends none back) never trigger a
handshake; the smallest packet that expects an answer (a TCP SYN, a DNS query, a ping) is
more. A healthy busy tunnel answers within a round trip; a one-way flow whose answers never
come costs one handshake per ``after`` s of silence at most. The default is short enough
that traffic is back within 3 s of a gateway that restarted at once (the silence began at
the crash, the gateway is back half a second later).

Each detection is logged with its reason and outcome and kept (:meth:`DeadPeerWatch.report`:
``/status`` ``dead_peer``, the heartbeat's ``status.dead_peer``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from anex_agent.agent.path import CHECK_EVERY, STALL_AFTER, Counters

log = logging.getLogger(__name__)

#: Seconds with data sent and nothing received before a fresh handshake (ANEX_DEAD_PEER_AFTER).
DEAD_AFTER = STALL_AFTER
#: Bytes sent between two looks that may be keepalives only (two 32-byte transport messages).
KEEPALIVE_ONLY = 64
#: Seconds between fresh handshakes while the gateways stay silent...
RETRY = 1.0
#: ...for this long; afterwards every RETRY_SLOW s (WireGuard's own REKEY_TIMEOUT).
FAST_FOR = 30.0
RETRY_SLOW = 5.0
EVENTS_KEPT = 20


@dataclass
class Silence:
    """Pure: says when data went out and nothing came back for ``after`` s.

    ``observe(rx, tx, now)`` returns the seconds since the first unanswered send once they
    reach ``after``, else None. Counters that went down (a peer re-added, an engine
    restarted) move the baseline and forget a pending send.
    """

    after: float = DEAD_AFTER
    keepalive_only: int = KEEPALIVE_ONLY
    rx: int = -1
    tx: int = -1
    sent_at: float | None = None

    def observe(self, rx: int, tx: int, now: float) -> float | None:
        if self.rx < 0 or rx < self.rx or tx < self.tx:  # first look, or the counters restarted (a
            self.rx, self.tx, self.sent_at = rx, tx, None  # re-added peer handshakes anew by itself)
            return None
        sent, self.tx = tx - self.tx, tx
        if rx != self.rx:  # something arrived
            self.rx, self.sent_at = rx, None
            return None
        if sent > self.keepalive_only and self.sent_at is None:
            self.sent_at = now
        if self.sent_at is not None and now - self.sent_at >= self.after:
            return now - self.sent_at
        return None

    def rebase(self) -> None:
        """Forget the baseline and any pending send (after a fresh handshake)."""
        self.rx, self.tx, self.sent_at = -1, -1, None


@dataclass
class DeadPeerWatch:
    """Watches the gateways' counters and starts fresh handshakes when they went silent; see the module."""

    after: float = DEAD_AFTER
    check_every: float = CHECK_EVERY
    retry: float = RETRY
    fast_for: float = FAST_FOR
    retry_slow: float = RETRY_SLOW
    detections: int = 0
    events: collections.deque[dict[str, Any]] = field(default_factory=lambda: collections.deque(maxlen=EVENTS_KEPT))

    def last(self) -> str:
        """The last detection in one line (for the heartbeat), '' if none."""
        if not self.events:
            return ""
        e = self.events[-1]
        outcome = ("handshake again after %.1f s" % e["recovered_after"] if e.get("recovered_after") is not None
                   else "no handshake yet")
        return f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(e['at']))}: {e['reason']}; {outcome}"

    def report(self) -> dict[str, Any]:
        return {"after": self.after, "detections": self.detections, "events": list(self.events)}

    async def run(self, counters: Callable[[], Awaitable[Counters]],
                  reset: Callable[[float], Awaitable[bool]]) -> None:
        """Until cancelled. ``reset(within)`` starts fresh handshakes and waits up to ``within``
        s for one (True when it came)."""
        silence = Silence(after=self.after)
        while True:
            await asyncio.sleep(self.check_every)
            seen = await counters()
            quiet = silence.observe(seen.rx, seen.tx, time.monotonic())
            if quiet is None:
                continue
            await self._revive(quiet, counters, reset)
            silence.rebase()

    async def _revive(self, quiet: float, counters: Callable[[], Awaitable[Counters]],
                      reset: Callable[[float], Awaitable[bool]]) -> None:
        """Fresh handshakes every ``retry`` s until one completes (the gateway is back)."""
        reason = f"data sent to the gateways and nothing received for {quiet:.1f} s"
        log.warning("dead peer: %s; starting a new handshake now", reason)
        self.detections += 1
        event: dict[str, Any] = {"at": round(time.time(), 3), "reason": reason, "attempts": 0, "recovered_after": None}
        self.events.append(event)
        began = time.monotonic()
        while True:
            attempt = time.monotonic()
            event["attempts"] += 1
            healed = await reset(self.retry)
            if not healed:  # no handshake yet; an engine that did not wait (wireproxy restarts): look for one
                waited = time.monotonic() - attempt >= self.retry / 2
                interval = self.retry if waited and attempt - began < self.fast_for else self.retry_slow
                await asyncio.sleep(max(0.0, attempt + interval - time.monotonic()))
                age = (await counters()).handshake_age
                healed = age is not None and age <= time.monotonic() - attempt
            if healed:
                event["recovered_after"] = round(time.monotonic() - began, 3)
                log.warning("dead peer: a gateway answered again %.1f s after the detection (%d handshake(s) started)",
                            event["recovered_after"], event["attempts"])
                return
            if event["attempts"] == 1 or event["attempts"] % 10 == 0:
                log.info("dead peer: no answer from the gateways yet (%d handshake(s) started)", event["attempts"])
