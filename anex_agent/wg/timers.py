"""Per-peer timers of whitepaper §6 (structure follows wireguard-go's ``timers.go``).

Five one-shot deadlines, as absolute ``now`` values (monotonic seconds) or None:

=====================  ===========================================================  ===========================
timer                  armed when                                                   on expiry (done by the device)
=====================  ===========================================================  ===========================
retransmit_handshake   we send an initiation: REKEY_TIMEOUT + jitter (§6.4)         resend, or give up after
                                                                                    REKEY_ATTEMPT_TIME
send_keepalive         we received data and have sent nothing since:               send a keepalive (§6.5)
                       KEEPALIVE_TIMEOUT
new_handshake          we sent data and received nothing since:                    start a handshake (§6.5)
                       KEEPALIVE_TIMEOUT + REKEY_TIMEOUT
zero_key_material      a session was derived: 3 * REJECT_AFTER_TIME                 erase all keys (§6.3)
persistent_keepalive   any authenticated packet in or out: the configured interval  send a keepalive (§6.5)
=====================  ===========================================================  ===========================

The methods named after events (``data_sent``, ``any_authenticated_packet_received``...)
are the only way the device moves these deadlines. ``jitter`` returns a float in [0, 1)
and is injected so tests can fix it.
"""

from __future__ import annotations

from collections.abc import Callable

from anex_agent.wg.constants import (
    KEEPALIVE_TIMEOUT,
    REKEY_TIMEOUT,
    REKEY_TIMEOUT_JITTER_MAX,
    ZERO_KEY_MATERIAL_AFTER,
)

TIMER_NAMES = ("retransmit_handshake", "send_keepalive", "new_handshake", "zero_key_material", "persistent_keepalive")


class PeerTimers:
    __slots__ = ("deadlines", "jitter", "persistent_keepalive", "handshake_attempts",
                 "need_another_keepalive", "sent_last_minute_handshake")

    def __init__(self, jitter: Callable[[], float], persistent_keepalive: float | None = None) -> None:
        self.deadlines: dict[str, float] = {}
        self.jitter = jitter
        self.persistent_keepalive = persistent_keepalive or None
        self.handshake_attempts = 0
        self.need_another_keepalive = False
        self.sent_last_minute_handshake = False

    # -- plumbing ----------------------------------------------------------------

    def pending(self, name: str) -> bool:
        return name in self.deadlines

    def next_deadline(self) -> float | None:
        return min(self.deadlines.values(), default=None)

    def pop_expired(self, now: float) -> list[str]:
        """Remove and return the timers due at ``now``, in TIMER_NAMES order."""
        due = [name for name in TIMER_NAMES if self.deadlines.get(name, float("inf")) <= now]
        for name in due:
            del self.deadlines[name]
        return due

    def clear(self) -> None:
        self.deadlines.clear()

    # -- events (wireguard-go timers.go names) -----------------------------------

    def data_sent(self, now: float) -> None:
        if "new_handshake" not in self.deadlines:
            self.deadlines["new_handshake"] = now + KEEPALIVE_TIMEOUT + REKEY_TIMEOUT

    def data_received(self, now: float) -> None:
        if "send_keepalive" not in self.deadlines:
            self.deadlines["send_keepalive"] = now + KEEPALIVE_TIMEOUT
        else:
            self.need_another_keepalive = True

    def any_authenticated_packet_sent(self) -> None:
        self.deadlines.pop("send_keepalive", None)

    def any_authenticated_packet_received(self) -> None:
        self.deadlines.pop("new_handshake", None)

    def any_authenticated_packet_traversal(self, now: float) -> None:
        if self.persistent_keepalive:
            self.deadlines["persistent_keepalive"] = now + self.persistent_keepalive

    def handshake_initiated(self, now: float) -> None:
        self.deadlines["retransmit_handshake"] = now + REKEY_TIMEOUT + self.jitter() * REKEY_TIMEOUT_JITTER_MAX

    def handshake_complete(self) -> None:
        self.deadlines.pop("retransmit_handshake", None)
        self.handshake_attempts = 0
        self.sent_last_minute_handshake = False

    def session_derived(self, now: float) -> None:
        self.deadlines["zero_key_material"] = now + ZERO_KEY_MATERIAL_AFTER

    def gave_up(self, now: float) -> None:
        """Handshake retries exhausted: stop keepalives; keys go away after ZERO_KEY_MATERIAL_AFTER."""
        self.deadlines.pop("send_keepalive", None)
        if "zero_key_material" not in self.deadlines:
            self.deadlines["zero_key_material"] = now + ZERO_KEY_MATERIAL_AFTER
