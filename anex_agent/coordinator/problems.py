"""RFC 9457 problem details: every error the coordinator returns is ``application/problem+json``.

Raise :class:`Problem` (or a helper below) anywhere in a handler; the middleware in
:mod:`.app` turns it, a pydantic ``ValidationError`` (422, one entry per field in
``errors``) or an unexpected exception (500, no exception text to the caller) into
a problem document.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from anex_agent.errors import AnexError

CONTENT_TYPE = "application/problem+json"
TYPE_BASE = "https://anex.sh/problems/"

# one text for every authentication failure, so an unauthenticated caller learns nothing
UNAUTHENTICATED_DETAIL = "missing, unknown, expired or already used credential or token"


class Problem(AnexError):
    def __init__(
        self,
        status: int,
        title: str,
        detail: str = "",
        *,
        slug: str | None = None,
        errors: list[dict[str, str]] | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail or title)
        self.status = status
        self.title = title
        self.detail = detail
        self.slug = slug
        self.errors = errors or []
        self.headers = headers or {}
        self.extra = extra

    def document(self, instance: str | None = None) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "type": TYPE_BASE + self.slug if self.slug else "about:blank",
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if instance:
            doc["instance"] = instance
        if self.errors:
            doc["errors"] = self.errors
        doc.update(self.extra)
        return doc

    def response(self, instance: str | None = None) -> web.Response:
        return web.Response(
            status=self.status,
            text=json.dumps(self.document(instance)),
            content_type=CONTENT_TYPE,
            headers=self.headers,
        )


def unauthenticated() -> Problem:
    return Problem(401, "Unauthorized", UNAUTHENTICATED_DETAIL, slug="unauthorized", headers={"WWW-Authenticate": "Bearer"})


#: Why a join token was refused (``reason`` of :func:`join_token_refused`'s problem).
TOKEN_REASONS = ("unknown", "kind", "expired", "used_up")


def join_token_refused(reason: str, message: str) -> Problem:
    """The 401 of a join or gateway registration whose token itself is refused, saying why.

    ``reason`` is one of :data:`TOKEN_REASONS`; ``message`` the sentence for ``errors``.
    A token that does not exist (never issued, or revoked) is ``unknown``; only a caller
    presenting a real token learns more (expired, used up, of the other kind), and only about
    that token: tokens carry 256 random bits, so the answer cannot be used to find one, and
    a holder of a spent token can do nothing more with it than before. The proof of key
    possession and a replayed nonce keep the generic :func:`unauthenticated`.
    """
    assert reason in TOKEN_REASONS
    return Problem(401, "Unauthorized", f"join token refused: {message}", slug="unauthorized",
                   headers={"WWW-Authenticate": "Bearer"}, errors=[{"field": "token", "message": message}],
                   reason=reason)


def forbidden(detail: str) -> Problem:
    return Problem(403, "Forbidden", detail, slug="forbidden")


def not_found(what: str) -> Problem:
    return Problem(404, "Not Found", f"{what} does not exist", slug="not-found")


def network_exhausted(detail: str) -> Problem:
    """503 for a join or gateway registration when no mesh address is free (retry later)."""
    return Problem(503, "Network Exhausted", detail, slug="network-exhausted", headers={"Retry-After": "60"})


def bad_request(detail: str, field: str | None = None) -> Problem:
    errors = [{"field": field, "message": detail}] if field else None
    return Problem(400, "Bad Request", detail, slug="bad-request", errors=errors)


def unsupported_media_type(accepted: str, got: str, what: str) -> Problem:
    """415 for a body that is not ``accepted`` (``Accept-Post`` names it, RFC 9110 §15.5.16)."""
    detail = f"the body must be {accepted} ({what}); got {got or 'none'}"
    return Problem(415, "Unsupported Media Type", detail, slug="unsupported-media-type",
                   headers={"Accept-Post": accepted})


def from_validation_error(err: ValidationError, *, location: str = "body") -> Problem:
    errors = []
    for item in err.errors(include_url=False):
        field = ".".join(str(part) for part in item["loc"]) or location
        errors.append({"field": field, "message": item["msg"]})
    fields = ", ".join(e["field"] for e in errors)
    return Problem(
        422, "Unprocessable Content", f"invalid {location}: check {fields}", slug="validation", errors=errors
    )
