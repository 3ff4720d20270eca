"""Dead-peer detection: the node sent to its gateways and heard nothing back; handshake again now.

A gateway that restarted has no session and, the node being behind NAT, does not know where
the node is: nothing happens until the node's WireGuard timers give up on the old session
(REKEY_TIMEOUT + KEEPALIVE_TIMEOUT, whitepaper §6.1/§6.5: about 15 s). The agent does not
wait for them, nor for the coordinator: when it has **sent data** to the gateways and
**received nothing** (no data, no keepalive, no handshake response) for ``after`` s
(``ANEX_DEAD_PEER_AFTER``, default :data:`DEAD_AFTER`, the path watcher's stall time), it starts a
new handshake at once
(:meth:`anex_agent.tunnels.engines.base.Engine.reset_sessions`, every engine) and repeats it every
:data:`RETRY` s until a handshake completes (every :data:`RETRY_SLOW` s once the gateways
have been silent for :data:`FAST_FOR` s, and always for an engine whose reset does not wait
for the handshake: wireproxy restarts its process), so traffic is back about a second after
the gateway is.

The signal is the one the path watcher uses (:mod:`anex_agent.agent.path`): the engine's
receive and send counters of the gateway peers (the watcher sums them; here each gateway's
own), read every :data:`CHECK_EVERY` s.
"Sent data" means more than :data:`KEEPALIVE_ONLY` bytes went out between two looks: a
keepalive is 32 bytes (an empty transport message, whitepaper §5.4.6), so the node's
persistent keepalives on an idle tunnel (the gateway sends none back) never trigger a
handshake; the smallest packet that expects an answer (a TCP SYN, a DNS query, a ping) is
more. A healthy busy tunnel answers within a round trip; a one-way flow whose answers never
come costs one handshake per ``after`` s of silence at most. The default is short enough
that traffic is back within 3 s of a gateway that restarted at once (the silence began at
the crash, the gateway is back half a second later).

Each gateway is judged by its own counters. With several gateways every one offers the mesh
network (and often the same routes); WireGuard gives a network to one peer only, so the engine
is given each network on one gateway's peer (:func:`assign`: the first in the config's order),
and the others are standbys (each keeps its own mesh address). When the gateway carrying a
network is silent for ``after`` x :data:`FAIL_OVER_SHARE` s and another handshook within
:data:`FRESH_HANDSHAKE` s, the silent one is *demoted*: its networks go to the next gateway
that offers them (the others keep their sessions), and the silent one's peer is re-added, so
it handshakes again as soon as it answers; its traffic then goes back to it. Without another gateway, fresh handshakes are started after
``after`` s as above.

Each detection is logged with its reason and outcome and kept (:meth:`DeadPeerWatch.report`:
``/status`` ``dead_peer``, the heartbeat's ``status.dead_peer``).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import ipaddress
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from anex_agent.agent.path import CHECK_EVERY, STALL_AFTER, Counters
from anex_agent.tunnels.engines.config import DesiredConfig

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
#: Share of ``after`` after which a silent gateway's traffic moves to another that answers:
#: cheap and undone when the silent one handshakes again, and it must beat the workload's own
#: retries (a lost TCP SYN is sent again after 1 s, then 3 s).
FAIL_OVER_SHARE = 0.5
EVENTS_KEPT = 20
#: A gateway whose last handshake is at most this old may take the traffic of a silent one
#: (an idle standby handshakes every two minutes, whitepaper §6.2: REKEY_AFTER_TIME).
FRESH_HANDSHAKE = 180.0


def assign(desired: DesiredConfig, demoted: frozenset[str] = frozenset()) -> DesiredConfig:
    """Pure: ``desired`` with every network on exactly one gateway peer.

    WireGuard routes a network to one peer only (cryptokey routing, whitepaper §2): set on a
    second peer, it moves there and the first lists it no more. Every gateway offers the mesh
    network, and gateways often offer the same routes, so a config that listed a network on
    each of them left the engine with whichever peer was written last (``(none)`` on the
    others), not one that answers; and every later write of one peer moved it again. So the
    engine is never given a network twice: each goes to the first gateway (in the config's
    order) that offers it and is not ``demoted``; a network only ``demoted`` gateways offer
    goes to the first of them. Networks of different lengths are no conflict (the longest
    prefix wins): a gateway's own address (a /32 inside the mesh network) stays its own.
    Non-gateway peers are not changed (the node has none)."""
    owner: dict[str, str] = {}
    for healthy in (True, False):
        for peer in desired.peers:
            if (peer.public_key not in demoted) == healthy:
                for network in peer.allowed_set():
                    owner.setdefault(network, peer.public_key)
    peers = tuple(
        dataclasses.replace(p, allowed_ips=tuple(c for c in p.allowed_ips
                                                 if owner[str(ipaddress.ip_network(c, strict=False))] == p.public_key))
        for p in desired.peers)
    if peers == desired.peers:
        return desired
    return dataclasses.replace(desired, peers=peers)


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
    fail_over_after: float = -1.0  # < 0: half of ``after`` (see FAIL_OVER_SHARE)
    demoted: dict[str, float] = field(default_factory=dict)  # public key -> when its traffic was moved away
    _silences: dict[str, Silence] = field(default_factory=dict, repr=False)
    _no_session: dict[str, float] = field(default_factory=dict, repr=False)  # key -> first look without a handshake
    sessionless: frozenset[str] = frozenset()  # of the last verdict: gateways that never handshook
    events: collections.deque[dict[str, Any]] = field(default_factory=lambda: collections.deque(maxlen=EVENTS_KEPT))

    def __post_init__(self) -> None:
        if self.fail_over_after < 0:
            self.fail_over_after = self.after * FAIL_OVER_SHARE

    def last(self) -> str:
        """The last detection in one line (for the heartbeat), '' if none."""
        if not self.events:
            return ""
        e = self.events[-1]
        outcome = ("handshake again after %.1f s" % e["recovered_after"] if e.get("recovered_after") is not None
                   else "no handshake yet")
        return f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(e['at']))}: {e['reason']}; {outcome}"

    def report(self) -> dict[str, Any]:
        return {"after": self.after, "detections": self.detections, "events": list(self.events),
                "demoted": sorted(self.demoted)}

    async def run(self, counters: Callable[[], Awaitable[dict[str, Counters]]],
                  reset: Callable[[float], Awaitable[bool]],
                  steer: Callable[[frozenset[str]], Awaitable[bool]] | None = None) -> None:
        """Until cancelled. ``counters()``: each gateway's counters by public key. ``reset(within)``
        starts fresh handshakes and waits up to ``within`` s for one (True when it came).
        ``steer(demoted)``: move the traffic of the ``demoted`` gateways to the others (None: one
        gateway only, or an engine that cannot)."""
        while True:
            await asyncio.sleep(self.check_every)
            seen = await counters()
            if steer is not None and self.demoted and await self._restore(seen, steer):
                self.rebase(seen)
                continue
            verdict = self.judge(seen, time.monotonic(), can_steer=steer is not None)
            if verdict is None:
                continue
            dead, others = verdict
            if others:
                assert steer is not None
                await self._fail_over(dead, others, steer)
                self.rebase(seen)
            else:
                await self._revive(max(dead.values()), counters, reset)
                self._silences.clear()  # the sessions were reset: the next look is the baseline

    def rebase(self, seen: dict[str, Counters]) -> None:
        """After the traffic moved: judge on from ``seen`` (the counters read before the move),
        pending sends forgotten. Not from the next look: a request sent meanwhile (a workload
        waking up just then) would be taken for the baseline and go unnoticed until it is sent
        again, a second or more later."""
        self._silences = {key: Silence(after=self.fail_over_after, rx=c.rx, tx=c.tx) for key, c in seen.items()}

    def judge(self, seen: dict[str, Counters], now: float, *, can_steer: bool) -> tuple[dict[str, float], list[str]] | None:
        """Pure but for the silences it keeps: one look at the counters. None: nothing to do;
        else ``(dead, others)``: the silent gateways (seconds of silence), and those to move
        their traffic to (empty: start fresh handshakes instead). A silent gateway's traffic
        moves after :attr:`fail_over_after` s when another answers; without one (or
        ``can_steer`` False) handshakes start after :attr:`after` s.

        A gateway with no session (no handshake since its peer was added) for
        :attr:`fail_over_after` s is silent too when another answers: what is sent to it waits
        in WireGuard's queue for a handshake (no byte counted) that it retries only every 5 s
        (REKEY_TIMEOUT, whitepaper §6.4), so its counters would tell nothing for that long."""
        dead: dict[str, float] = {}
        sessionless: dict[str, float] = {}
        for key, c in seen.items():
            if c.handshake_age is None:
                since = self._no_session.setdefault(key, now)
            else:
                self._no_session.pop(key, None)
            quiet = self._silences.setdefault(key, Silence(after=self.fail_over_after)).observe(c.rx, c.tx, now)
            if key in self.demoted:  # a demoted one gets no data, only retries
                continue
            if quiet is not None:
                dead[key] = quiet
            elif c.handshake_age is None and now - since >= self.fail_over_after:
                sessionless[key] = now - since
        if not dead and not sessionless:
            return None
        others = sorted(k for k, c in seen.items() if k not in dead and k not in sessionless and k not in self.demoted
                        and c.handshake_age is not None and c.handshake_age <= FRESH_HANDSHAKE)
        if can_steer and others:
            self.sessionless = frozenset(sessionless)
            return {**dead, **sessionless}, others
        if not dead:
            return None  # a gateway that never answered and no other: WireGuard's own retries
        if max(dead.values()) >= self.after:
            return dead, []
        return None  # no other gateway to move to: wait the whole ``after`` before handshaking again

    async def _fail_over(self, dead: dict[str, float], others: list[str],
                         steer: Callable[[frozenset[str]], Awaitable[bool]]) -> None:
        silent = sorted(k for k in dead if k not in self.sessionless)
        whys = [f"data sent to gateway {', '.join(k[:8] for k in silent)} and nothing received "
                f"for {max(dead[k] for k in silent):.1f} s"] if silent else []
        unanswered = sorted(k for k in dead if k in self.sessionless)
        if unanswered:
            whys.append(f"no handshake with gateway {', '.join(k[:8] for k in unanswered)} "
                        f"for {max(dead[k] for k in unanswered):.1f} s")
        reason = f"{'; '.join(whys)}; traffic moved to gateway {', '.join(k[:8] for k in others)}"
        log.warning("dead peer: %s", reason)
        self.detections += 1
        at = time.monotonic()
        for key in dead:
            self.demoted[key] = at
        event: dict[str, Any] = {"at": round(time.time(), 3), "reason": reason, "attempts": 1, "recovered_after": None}
        self.events.append(event)
        if await steer(frozenset(self.demoted)):
            event["recovered_after"] = round(time.monotonic() - at, 3)

    async def _restore(self, seen: dict[str, Counters], steer: Callable[[frozenset[str]], Awaitable[bool]]) -> bool:
        """A demoted gateway that handshook since it was demoted takes its traffic back."""
        now = time.monotonic()
        back = [k for k, at in self.demoted.items()
                if k not in seen or (seen[k].handshake_age is not None and seen[k].handshake_age < now - at)]
        if not back:
            return False
        for key in back:
            del self.demoted[key]
        log.warning("dead peer: gateway %s answers again; its traffic goes back to it", ", ".join(k[:8] for k in back))
        await steer(frozenset(self.demoted))
        return True

    async def _revive(self, quiet: float, counters: Callable[[], Awaitable[dict[str, Counters]]],
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
                ages = [c.handshake_age for c in (await counters()).values() if c.handshake_age is not None]
                healed = bool(ages) and min(ages) <= time.monotonic() - attempt
            if healed:
                event["recovered_after"] = round(time.monotonic() - began, 3)
                log.warning("dead peer: a gateway answered again %.1f s after the detection (%d handshake(s) started)",
                            event["recovered_after"], event["attempts"])
                return
            if event["attempts"] == 1 or event["attempts"] % 10 == 0:
                log.info("dead peer: no answer from the gateways yet (%d handshake(s) started)", event["attempts"])
