"""What the agent and the gateway say when the coordinator refuses their join token.

Contract: :func:`refusal` turns the coordinator's 401 to a join (or a gateway registration)
into one :class:`~anex_agent.errors.ConfigError` naming where the token came from
(``ANEX_JOIN_TOKEN``, ``ANEX_JOIN_TOKEN_FILE``, ``--token``, ``--token-file``,
``ANEX_GATEWAY_TOKEN``, ...), why it was refused (the coordinator's ``reason``: unknown, of
the other kind, expired, used up; see :func:`anex_agent.coordinator.problems.join_token_refused`)
and how to get a new one. Anything but a 401 is not about the token: None.
"""

from __future__ import annotations

from anex_agent.errors import ConfigError, CoordinatorError

#: How an operator gets a join token of each kind (docs/coordinator.md, "Join tokens").
NEW_TOKEN = {
    "node": "get a new one with the coordinator's admin token (anex-agent admin tokens create --kind node, or "
            'POST /v1/join-tokens with {"kind": "node"})',
    "gateway": "get a new one with the coordinator's admin token (anex-agent admin tokens create --kind gateway "
               '--reusable --ttl 365d, or POST /v1/join-tokens with {"kind": "gateway", "reusable": true, '
               '"expires_in": 31536000}: a gateway presents it at every start)',
}


def token_reason(problem: dict) -> str | None:
    """The coordinator's sentence about the token itself, when its problem document has one."""
    for item in problem.get("errors") or ():
        if isinstance(item, dict) and item.get("field") == "token" and isinstance(item.get("message"), str):
            return item["message"][:200]
    return None


def refusal(source: str, err: CoordinatorError, kind: str = "node") -> ConfigError | None:
    """The one line for a join of ``kind`` refused because of its token (a 401), naming ``source``; else None."""
    if err.status != 401:
        return None
    reason = token_reason(err.problem)
    if reason is None:  # the proof of key possession, or a coordinator that does not say why
        reason = ("not accepted (unknown, expired, used up or of another kind; or this machine's clock is more "
                  "than a few minutes off)")
    return ConfigError(source, f"the coordinator refused this join token: {reason}; {NEW_TOKEN[kind]} and set it "
                               f"in {source}")
