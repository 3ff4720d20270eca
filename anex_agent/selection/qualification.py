"""Which on-prem nodes qualify for selection: a qualification policy is a set of rule ids (pure).

Two kinds of rules:

* **runnable** rules decide whether a job can run at all and always apply; the coordinator
  judges them from the node's telemetry (docs/telemetry.md v1):

  * ``driver_loaded``  NVML answers (``nvml.state`` is ``ok``): the driver is loaded and matches;
  * ``gpu_present``    the inventory lists at least one GPU;
  * ``gpu_healthy``    the node's health and the telemetry verdict are ``healthy``.

  Enough memory and disk for what the pod asks is the pod's own ``ram`` / ``disk-space-gb``
  filters, checked against the node's telemetry like any other offer.

* **hardware** rules are the on-prem hardware rules of :data:`anex_agent.telemetry.models.QUALIFICATION_RULES` (the ids and scopes of :data:`anex_agent.gpu.qualify.RULES`)
  (the agent evaluates them and sends ``telemetry["qualification"]``). A policy says which of
  them a node must pass:

  * ``runnable`` (the default): none;
  * ``required``: the rules required of all systems (``gpu_model``, ``nvme_drives``,
    ``nvme_capacity``, ``tpm``);
  * ``full``: every rule, those for selling spare capacity (``memory``, ``pcie_lanes``,
    ``cpu_cores``) included;
  * or any comma-separated mix of these names and rule ids, e.g. ``"required,memory"`` or
    ``"tpm"``.

A node's policy is its label ``qualification`` (from its join token's labels, so per token,
or set on the node by an administrator), else the coordinator's default
(``ANEX_SELECTION_QUALIFICATION``). :func:`first_failure` names the first rule a node fails.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from anex_agent.telemetry.models import QUALIFICATION_RULES

RUNNABLE_RULES = ("driver_loaded", "gpu_present", "gpu_healthy")
HARDWARE_RULES: tuple[str, ...] = tuple(rule for rule, _ in QUALIFICATION_RULES)
_SCOPE = dict(QUALIFICATION_RULES)
POLICIES: dict[str, frozenset[str]] = {
    "runnable": frozenset(),
    "required": frozenset(rule for rule, scope in QUALIFICATION_RULES if scope == "required"),
    "full": frozenset(HARDWARE_RULES),
}
DEFAULT_POLICY = "runnable"
LABEL = "qualification"


def parse_policy(text: str) -> frozenset[str]:
    """The hardware rule ids of a policy text (names and rule ids, comma-separated).

    Raises ``ValueError`` saying what is accepted.
    """
    rules: set[str] = set()
    items = [item.strip().lower() for item in str(text).split(",") if item.strip()]
    if not items:
        raise ValueError(f"empty qualification policy; accepted: {accepted()}")
    for item in items:
        if item in POLICIES:
            rules |= POLICIES[item]
        elif item in HARDWARE_RULES:
            rules.add(item)
        elif item in RUNNABLE_RULES:
            continue  # always applied
        else:
            raise ValueError(f"unknown qualification policy or rule {item!r}; accepted: {accepted()}")
    return frozenset(rules)


def accepted() -> str:
    return (f"a comma-separated list of policies ({', '.join(POLICIES)}) and rule ids "
            f"({', '.join(HARDWARE_RULES)})")


def _runnable_failure(node: Mapping[str, Any], telemetry: Mapping[str, Any]) -> str:
    nvml = telemetry.get("nvml") or {}
    state = nvml.get("state") if isinstance(nvml, Mapping) else None
    if state != "ok":
        return f"rule driver_loaded failed: NVML state {state!r} (the NVIDIA driver must be loaded and answer)"
    inventory = telemetry.get("inventory") or {}
    if not [g for g in inventory.get("gpus") or [] if isinstance(g, Mapping)]:
        return "rule gpu_present failed: no GPUs in telemetry inventory"
    health = node.get("health")
    verdict = (telemetry.get("health") or {}).get("verdict")
    if health != "healthy" or verdict not in (None, "healthy"):
        return f"rule gpu_healthy failed: not healthy (health {health!r}, telemetry verdict {verdict!r})"
    return ""


def _check_of(rule: str, qualification: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for check in qualification.get("checks") or []:
        if isinstance(check, Mapping) and check.get("id") == rule:
            return check
    return None


def _checked_failure(rule: str, check: Mapping[str, Any]) -> str:
    status = check.get("status")
    if status == "pass":
        return ""
    said = f"measured {check.get('measured', '?')}, required {check.get('required', '?')}"
    detail = check.get("detail")
    verb = "not checked" if status == "not_checked" else "failed"
    return f"rule {rule} {verb} ({said}{'; ' + str(detail) if detail else ''})"


def _unlisted_failure(rule: str, qualification: Mapping[str, Any]) -> str:
    """A rule the report has no check for (an older agent): the report's summary flags decide."""
    if qualification.get("status") == "pass":
        return ""
    flag = {"required": "required_ok", "marketplace": "marketplace_ok"}.get(_SCOPE.get(rule, ""))
    if flag and qualification.get(flag) is True:
        return ""
    return f"rule {rule} not in the node's qualification report (status {qualification.get('status')!r})"


def first_failure(node: Mapping[str, Any], telemetry: Mapping[str, Any], policy: frozenset[str],
                  policy_name: str) -> str:
    """Why ``node`` does not qualify under ``policy`` (its hardware rule ids), or ``""``.

    Runnable rules first, then the policy's hardware rules in :data:`HARDWARE_RULES` order
    (those the node's report has a check for, then those it lacks); the reason names the
    rule and the policy.
    """
    reason = _runnable_failure(node, telemetry)
    if reason or not policy:
        return reason
    report = telemetry.get("qualification")
    rules = [rule for rule in HARDWARE_RULES if rule in policy]
    if not isinstance(report, Mapping):
        return (f"qualification policy {policy_name!r}: rule {rules[0]} not checked: the node sent no "
                "qualification report")
    checked = {rule: _check_of(rule, report) for rule in rules}
    reasons = [_checked_failure(rule, check) for rule, check in checked.items() if check is not None]
    reasons += [_unlisted_failure(rule, report) for rule, check in checked.items() if check is None]
    reason = next((r for r in reasons if r), "")
    return f"qualification policy {policy_name!r}: {reason}" if reason else ""
