"""The error document of every route: RFC 9457 problem details (``application/problem+json``).

The coordinator writes them (:mod:`anex_agent.coordinator.problems`) and describes them with
:class:`Problem` in ``/v1/openapi.json``; clients keep the document as sent
(``CoordinatorError.problem``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Problem(BaseModel):
    """RFC 9457 problem details (``application/problem+json``).

    ``errors`` lists field-level problems: ``{"field": "public_key", "message": "..."}``.
    """

    model_config = ConfigDict(extra="allow")

    type: str = "about:blank"
    title: str
    status: int
    detail: str = ""
    instance: str | None = None
    errors: list[dict[str, str]] = Field(default_factory=list)
