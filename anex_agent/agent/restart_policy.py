"""When ``anex-agent run`` starts its workload again after it exits, and after how long (pure).

The policy is the pod's ``restartPolicy`` (``ANEX_RESTART_POLICY``, parsed once by
:mod:`.run_options`): ``Never`` (the default: the agent ends with the workload), ``OnFailure``
(again after a non-zero status) or ``Always``. Between two runs the agent waits as a kubelet
does (``CrashLoopBackOff``): 10 s, doubling up to 5 minutes, without jitter (a
:class:`anex_agent.backoff.Backoff` with ``jitter=False``); a run that lasted 10 minutes or more
starts the back-off over.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from anex_agent.backoff import Backoff
from anex_agent.errors import ConfigError

POLICIES = ("Never", "OnFailure", "Always")
BACKOFF_BASE = 10.0  # seconds before the first restart
BACKOFF_CAP = 300.0  # the longest wait between two runs
BACKOFF_RESET = 600.0  # a run at least this long starts the back-off over


def parse_policy(text: str, source: str = "ANEX_RESTART_POLICY") -> str:
    """``text`` as one of :data:`POLICIES` (ConfigError naming ``source`` otherwise)."""
    if text not in POLICIES:
        raise ConfigError(source, f"{text!r} is not a restart policy; expected one of {', '.join(POLICIES)}")
    return text


def restarts(policy: str, status: int) -> bool:
    """Whether a workload that exited with ``status`` is started again under ``policy``."""
    return policy == "Always" or (policy == "OnFailure" and status != 0)


@dataclass
class CrashLoopBackoff:
    """The kubelet's back-off between runs of a container that keeps exiting."""

    base: float = BACKOFF_BASE
    cap: float = BACKOFF_CAP
    reset_after: float = BACKOFF_RESET
    _backoff: Backoff = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._backoff = Backoff(base=self.base, cap=self.cap, jitter=False)

    def next_delay(self, ran_for: float) -> float:
        """Seconds to wait before the next run, the last one having lasted ``ran_for`` seconds."""
        if ran_for >= self.reset_after:
            self._backoff.reset()
        return self._backoff.next_delay()
