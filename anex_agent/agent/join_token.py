"""What the agent says when the coordinator refuses its join token.

Contract: :func:`refusal` turns the coordinator's 401 to a join into one
:class:`~anex_agent.errors.ConfigError` naming where the token came from
(``ANEX_JOIN_TOKEN``, ``ANEX_JOIN_TOKEN_FILE``, ``--token`` or ``--token-file``), why it was
refused (the coordinator's ``reason``: unknown, of the other kind, expired, used up; see
:func:`anex_agent.coordinator.problems.join_token_refused`) and how to get a new one.
Anything but a 401 is not about the token: None.
"""

from __future__ import annotations

from anex_agent.errors import ConfigError, CoordinatorError

#: How an operator gets a node join token (docs/coordinator.md, "Join tokens").
NEW_TOKEN = ('get a new one from the coordinator (POST /v1/join-tokens with the admin token and the body '
             '{"kind": "node"})')


def token_reason(problem: dict) -> str | None:
    """The coordinator's sentence about the token itself, when its problem document has one."""
    for item in problem.get("errors") or ():
        if isinstance(item, dict) and item.get("field") == "token" and isinstance(item.get("message"), str):
            return item["message"][:200]
    return None


def refusal(source: str, err: CoordinatorError) -> ConfigError | None:
    """The one line for a join refused because of its token (a 401), naming ``source``; else None."""
    if err.status != 401:
        return None
    reason = token_reason(err.problem)
    if reason is None:  # the proof of key possession, or a coordinator that does not say why
        reason = ("not accepted (unknown, expired, used up or of another kind; or this machine's clock is more "
                  "than a few minutes off)")
    return ConfigError(source, f"the coordinator refused this join token: {reason}; {NEW_TOKEN} and set it in "
                               f"{source}")
