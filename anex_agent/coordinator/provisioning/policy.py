"""A provision's recovery policy: which events start another attempt, for how long, how soon; the
deadline of each boot phase; interruptible capacity; the idle release. Parsed once, at the edge.

Annotations (on the provision, beside the selection's; each overrides the coordinator's default):

| annotation | value | default (variable) |
|---|---|---|
| ``anex.sh/retry-on`` | comma-separated events: ``no-capacity``, ``error``, ``interruption``; ``none`` | ``ANEX_PROVISION_RETRY_ON`` (none) |
| ``anex.sh/retry-for`` | duration (``90s``, ``15m``, ``2h``, ``1d``) | ``ANEX_PROVISION_RETRY_FOR`` (1h) |
| ``anex.sh/deadline-rent`` | duration: the rent call answered | ``ANEX_PROVISION_DEADLINE_RENT`` (1m) |
| ``anex.sh/deadline-running`` | duration: the machine running at the provider, from its rental | ``ANEX_PROVISION_DEADLINE_RUNNING`` (150s) |
| ``anex.sh/deadline-join`` | duration: the agent joined, from the machine running | ``ANEX_PROVISION_DEADLINE_JOIN`` (2m) |
| ``anex.sh/deadline-heartbeat`` | duration: the first heartbeat, from the join | ``ANEX_PROVISION_DEADLINE_HEARTBEAT`` (1m) |
| ``anex.sh/deadline-workload`` | duration: the workload started, from the first heartbeat | ``ANEX_PROVISION_DEADLINE_WORKLOAD`` (5m) |
| ``anex.sh/interruptible`` | ``true`` / ``false``: rent interruptible (Vast.AI bid) or spot (RunPod) capacity | false |
| ``anex.sh/idle-release`` | duration, or ``off``: release the machine after its GPUs stayed idle that long | ``ANEX_PROVISION_IDLE_RELEASE`` (off) |
| ``anex.sh/idle-threshold`` | percent 0-100: a GPU below it is idle | ``ANEX_PROVISION_IDLE_THRESHOLD`` (5) |

Events: ``no-capacity`` (no candidate left to rent, every one refused or without capacity),
``error`` (a phase past its deadline, a provider that stayed unavailable, an unhealthy GPU),
``interruption`` (the machine was outbid, preempted or taken back, or its heartbeats stopped).
The retry window (``retry-for``) starts at the first event since the provision was last
``ready``; retries wait :class:`anex_agent.backoff.Backoff` delays (equal jitter:
``[d/2, d]`` for ``d = base * 2**n`` capped; ``ANEX_PROVISION_RETRY_BACKOFF`` base, 30 s,
``ANEX_PROVISION_RETRY_BACKOFF_MAX`` cap, 600 s).

:func:`parse_policy` raises :class:`~anex_agent.selection.annotations.AnnotationError`
naming each bad annotation (the API answers 400 naming ``annotations.<key>``);
:meth:`PolicyDefaults.from_env` raises :class:`~anex_agent.errors.ConfigError` naming the variable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from anex_agent import parse
from anex_agent.backoff import Backoff
from anex_agent.errors import ConfigError, config_value
from anex_agent.selection.annotations import (
    BOOL_WORDS, PROVISIONING_NAMES, SHARED, AnnotationError, AnnotationProblem,
)

NO_CAPACITY, ERROR, INTERRUPTION = "no-capacity", "error", "interruption"
EVENTS = (NO_CAPACITY, ERROR, INTERRUPTION)
PHASES = ("rent", "running", "join", "heartbeat", "workload")
MAX_DURATION = 30 * 86400

RETRY_ON = SHARED + "retry-on"
RETRY_FOR = SHARED + "retry-for"
INTERRUPTIBLE = SHARED + "interruptible"
IDLE_RELEASE = SHARED + "idle-release"
IDLE_THRESHOLD = SHARED + "idle-threshold"
DEADLINE_PREFIX = SHARED + "deadline-"
#: the ``anex.sh/`` names this module reads (the selection leaves them to it)
NAMES = PROVISIONING_NAMES


@dataclass(frozen=True)
class RecoveryPolicy:
    retry_on: frozenset[str] = frozenset()
    retry_for: float = 3600.0
    backoff: float = 30.0
    backoff_max: float = 600.0
    deadlines: Mapping[str, float] | None = None  # phase -> seconds (every phase of PHASES)
    interruptible: bool = False
    idle_release: float | None = None  # seconds; None: off
    idle_threshold: float = 5.0  # percent GPU utilization

    def deadline(self, phase: str) -> float:
        return float((self.deadlines or DEFAULT_DEADLINES)[phase])

    def retries(self, event: str) -> bool:
        return event in self.retry_on

    def delay(self, retries: int) -> float:
        """Seconds before retry number ``retries + 1`` (one :class:`Backoff`, its jitter)."""
        return Backoff(base=self.backoff, cap=self.backoff_max, attempts=retries).next_delay()


DEFAULT_DEADLINES: Mapping[str, float] = {"rent": 60.0, "running": 150.0, "join": 120.0, "heartbeat": 60.0,
                                          "workload": 300.0}


def _events(text: str) -> frozenset[str]:
    words = [w.strip() for w in text.split(",") if w.strip()]
    if words == ["none"]:
        return frozenset()
    bad = [w for w in words if w not in EVENTS]
    if bad:
        raise ValueError(f"must be a comma-separated list of {', '.join(EVENTS)}, or none (unknown: "
                         f"{', '.join(map(repr, bad))})")
    return frozenset(words)


def _duration(text: str) -> float:
    return float(parse.duration(text.strip(), minimum=1, maximum=MAX_DURATION))


def _idle(text: str) -> float | None:
    return None if text.strip() in ("off", "0") else _duration(text)


def _percent(text: str) -> float:
    value = parse.number(text.strip(), minimum=0)
    if value > 100:
        raise ValueError("must be a percent from 0 to 100")
    return value


def _bool(text: str) -> bool:
    """As the selection's boolean annotations: ``true`` or ``false``."""
    value = BOOL_WORDS.get(text.strip().lower())
    if value is None:
        raise ValueError(f'{text!r} is not a boolean; accepted: "true" or "false"')
    return value


@dataclass(frozen=True)
class PolicyDefaults:
    """The coordinator's policy, for provisions that do not say (from its environment)."""

    policy: RecoveryPolicy = RecoveryPolicy()

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> PolicyDefaults:
        def get(name: str, parser, default):
            text = environ.get(name, "")
            return default if text.strip() == "" else config_value(name, parser, text)

        base = RecoveryPolicy()
        deadlines = {p: get(f"ANEX_PROVISION_DEADLINE_{p.upper()}", _duration, DEFAULT_DEADLINES[p]) for p in PHASES}
        backoff = get("ANEX_PROVISION_RETRY_BACKOFF", _duration, base.backoff)
        backoff_max = get("ANEX_PROVISION_RETRY_BACKOFF_MAX", _duration, base.backoff_max)
        if backoff_max < backoff:
            raise ConfigError("ANEX_PROVISION_RETRY_BACKOFF_MAX", f"{backoff_max:g} s is below "
                              f"ANEX_PROVISION_RETRY_BACKOFF ({backoff:g} s)")
        return cls(RecoveryPolicy(
            retry_on=get("ANEX_PROVISION_RETRY_ON", _events, base.retry_on),
            retry_for=get("ANEX_PROVISION_RETRY_FOR", _duration, base.retry_for),
            backoff=backoff, backoff_max=backoff_max, deadlines=deadlines,
            idle_release=get("ANEX_PROVISION_IDLE_RELEASE", _idle, base.idle_release),
            idle_threshold=get("ANEX_PROVISION_IDLE_THRESHOLD", _percent, base.idle_threshold),
        ))


def parse_policy(annotations: Mapping[str, str], defaults: RecoveryPolicy | None = None) -> RecoveryPolicy:
    """The policy ``annotations`` ask for over ``defaults``; AnnotationError naming every bad one."""
    policy = defaults or RecoveryPolicy()
    problems: list[AnnotationProblem] = []
    changes: dict[str, object] = {}
    deadlines = dict(policy.deadlines or DEFAULT_DEADLINES)
    fields = {RETRY_ON: ("retry_on", _events), RETRY_FOR: ("retry_for", _duration),
              INTERRUPTIBLE: ("interruptible", _bool), IDLE_RELEASE: ("idle_release", _idle),
              IDLE_THRESHOLD: ("idle_threshold", _percent)}
    for key, raw in annotations.items():
        if key in fields:
            name, parser = fields[key]
        elif key.startswith(DEADLINE_PREFIX) and key[len(DEADLINE_PREFIX):] in PHASES:
            name, parser = key, _duration
        else:
            continue
        try:
            value = parser(raw)
        except (ValueError, AttributeError) as err:
            problems.append(AnnotationProblem(key, str(err) if isinstance(err, ValueError) else "must be a string"))
            continue
        if name == key:
            deadlines[key[len(DEADLINE_PREFIX):]] = value
        else:
            changes[name] = value
    if problems:
        raise AnnotationError(problems)
    return replace(policy, deadlines=deadlines, **changes)
