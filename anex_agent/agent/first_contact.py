"""The first handshake with a gateway, without WireGuard's 5 s wait.

A node registers with the coordinator and brings its tunnel up at once; the gateway learns of
the node from the coordinator's watch stream a moment later. A first initiation that reaches
the gateway before that is dropped (an unknown key), and WireGuard sends the next one only
REKEY_TIMEOUT (5 s, whitepaper §6.4) later: the workload's first request waited those 5 s.

So, for every gateway the config just named (at start, or added later) that has no handshake
yet, the agent asks the engine for a new initiation (:meth:`Engine.handshake_now`, every
engine) after :data:`FIRST_RETRY` s and then with a back-off (x :data:`FACTOR`, jittered, at
most :data:`RETRY_CAP` s apart) until the gateway answers, for :data:`RETRY_FOR` s at most;
after that WireGuard's own retries and the dead-peer watch (:mod:`.liveness`) carry on.
Each answer is logged with the number of initiations asked for (``first handshake with
gateway ... after ...``) and counted (:attr:`FirstContact.asked`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field

from anex_agent.backoff import Backoff

log = logging.getLogger(__name__)

#: Seconds after the tunnel came up before the first extra initiation (at most; jittered down to
#: half). A gateway hears of a node from the coordinator within a few hundred ms of its
#: registration; an extra initiation replaces one still in flight (its answer is then dropped),
#: so it comes no sooner than a slow round trip on a busy machine.
FIRST_RETRY = 0.5
FACTOR = 1.5
#: Longest gap between two extra initiations (well below REKEY_TIMEOUT, or they would add little):
#: a gateway that learns of the node late answers within a second of learning.
RETRY_CAP = 1.0
#: How long extra initiations are asked for a gateway that does not answer.
RETRY_FOR = 30.0


@dataclass
class FirstContact:
    """Asks for extra initiations to the gateways in :attr:`waiting` until each answered (see the module)."""

    first_retry: float = FIRST_RETRY
    cap: float = RETRY_CAP
    retry_for: float = RETRY_FOR
    waiting: dict[str, float] = field(default_factory=dict)  # public key -> when it was named (monotonic)
    asked: dict[str, int] = field(default_factory=dict)  # public key -> extra initiations asked for
    answered: dict[str, float] = field(default_factory=dict)  # public key -> seconds to its first handshake
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    _fresh: bool = field(default=False, repr=False)  # a gateway was added: the back-off starts over

    def add(self, keys: Collection[str]) -> bool:
        """Gateways just named with no handshake yet; True when any is new."""
        now = self.clock()
        new = [k for k in keys if k not in self.waiting]
        for key in new:
            self.waiting[key] = now
            self.asked[key] = 0
        self._fresh |= bool(new)
        return bool(new)

    async def run(self, handshaken: Callable[[], Awaitable[Collection[str]]],
                  ask: Callable[[frozenset[str]], Awaitable[object]],
                  sleep: Callable[[float], Awaitable[object]],
                  answered: Callable[[], object] = lambda: None) -> None:
        """Until no gateway waits. ``handshaken()``: the gateways with a handshake now;
        ``ask(keys)``: a new initiation to each of ``keys`` (the engine's handshake_now);
        ``sleep(s)``: the event loop's sleep; ``answered()``: called when a gateway that was asked
        answered (what was sent to it meanwhile may have been dropped with the re-added peer:
        the caller starts connection attempts in flight again)."""
        backoff = Backoff(base=self.first_retry, cap=self.cap, factor=FACTOR)
        while self.waiting:
            if self._fresh:
                self._fresh = False
                backoff.reset()
            await sleep(backoff.next_delay())
            done = set(await handshaken())
            now = self.clock()
            asked_answered = False
            for key in [k for k in self.waiting if k in done]:
                took = now - self.waiting.pop(key)
                self.answered[key] = round(took, 3)
                asked_answered |= self.asked[key] > 0
                log.info("first handshake with gateway %s after %.2f s (%d extra initiation(s) asked for)",
                         key[:8], took, self.asked[key])
            if asked_answered:
                answered()
            for key in [k for k, since in self.waiting.items() if now - since > self.retry_for]:
                del self.waiting[key]
                log.info("gateway %s has not answered in %.0f s; WireGuard keeps trying on its own", key[:8],
                         self.retry_for)
            if not self.waiting:
                return
            keys = frozenset(self.waiting)
            for key in keys:
                self.asked[key] += 1
            await ask(keys)
