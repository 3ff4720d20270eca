"""The coordinator as ``anex-agent admin`` sees it: admin calls, their failures as one line each.

Contract:
* :class:`AdminSettings` is what the command line and the environment said, parsed once
  (:func:`settings_from`): the coordinator URL and where it came from, the admin token and
  where it came from (a variable or a file: never the command line), the CA file.
* :meth:`AdminApi.call` makes one admin call and returns the answer's JSON (None for 204).
  Its failures, each one line naming what to check:

  - no answer (refused, unreachable, TLS, timed out): :class:`~anex_agent.errors.CoordinatorError`
    "cannot reach the coordinator at URL (from SOURCE): why";
  - 401: :class:`~anex_agent.errors.ConfigError` naming where the token was read from;
  - 404: ConfigError naming the argument (``what``) and the ``list`` command that shows what exists;
  - 400/422 on a create: ConfigError naming the flag of the refused field (``fields``: JSON
    field -> flag), with the coordinator's words;
  - anything else: CoordinatorError "METHOD PATH: STATUS detail".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from anex_agent.client import transport
from anex_agent.host.config_secrets import SecretSpec, pick_secret
from anex_agent.errors import ConfigError, CoordinatorError

ADMIN_TOKEN = SecretSpec(None, "ANEX_ADMIN_TOKEN", file_flag="--token-file")
URL_VAR = "ANEX_COORDINATOR_URL"


@dataclass(frozen=True)
class AdminSettings:
    url: str
    url_source: str
    token: str = field(repr=False)
    token_source: str
    ca_file: Path | None = None


def settings_from(args: Any, environ: Mapping[str, str] | None = None) -> AdminSettings:
    """The settings of ``args`` (``coordinator``, ``token_file``, ``ca_file``, ``allow_insecure``) and
    ``environ``; ConfigError naming the flag or variable for anything missing or unusable."""
    env = os.environ if environ is None else environ
    url, url_source = getattr(args, "coordinator", None), "--coordinator"
    if not url:
        url, url_source = env.get(URL_VAR, "").strip(), URL_VAR
    if not url:
        raise ConfigError(URL_VAR, "is not set; expected the coordinator URL, e.g. http://127.0.0.1:8700 "
                                   "(or --coordinator URL)")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(url_source, f"{url!r} is not an http:// or https:// URL")
    allow = bool(getattr(args, "allow_insecure", False)) or transport.allow_insecure_from(env)
    transport.check_coordinator_url(url, url_source, allow_insecure=allow,
                                    allow_hint=f"{transport.ALLOW_INSECURE_VAR}=1 or --allow-insecure")
    token, token_source = pick_secret(ADMIN_TOKEN, env, file_value=getattr(args, "token_file", None))
    if not token:
        raise ConfigError("ANEX_ADMIN_TOKEN", "is not set; give the coordinator's admin token in ANEX_ADMIN_TOKEN, "
                          "or a file holding it in ANEX_ADMIN_TOKEN_FILE or --token-file FILE (the coordinator "
                          "writes it to <state-dir>/admin-token when none was given)")
    ca_file = getattr(args, "ca_file", None)
    if ca_file:
        ca_file = transport.parse_ca_file(str(ca_file), "--ca-file")
    else:
        ca_file = transport.parse_ca_file(env.get(transport.CA_FILE_VAR), transport.CA_FILE_VAR)
    return AdminSettings(url.rstrip("/"), url_source, token, token_source or "", ca_file)


def segment(value: str) -> str:
    """``value`` as one path segment (an id typed by a person may hold anything)."""
    return quote(value, safe="")


class AdminApi:
    """Admin calls to one coordinator (see the module contract). Use as ``async with``."""

    def __init__(self, settings: AdminSettings) -> None:
        from anex_agent.client.rest import CoordinatorClient

        self.settings = settings
        self.client = CoordinatorClient(settings.url, admin_token=settings.token, ca_file=settings.ca_file)

    async def __aenter__(self) -> AdminApi:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()

    async def call(self, method: str, path: str, *, body: Any = None, what: tuple[str, str] | None = None,
                   fields: Mapping[str, str] | None = None) -> Any:
        """The answer's JSON. ``what``: (argument, its value) a 404 is about, e.g. ``("NODE", "web-1")``."""
        try:
            return await self.client.call_json(method, path, body=body)
        except CoordinatorError as err:
            raise self._explain(err, what, fields) from None

    def _explain(self, err: CoordinatorError, what: tuple[str, str] | None,
                 fields: Mapping[str, str] | None) -> Exception:
        s = self.settings
        if err.status is None:
            why = str(err).split(": ", 1)[-1]
            return CoordinatorError(f"cannot reach the coordinator at {s.url} (from {s.url_source}): {why}",
                                    retryable=err.retryable)
        if err.status == 401:
            return ConfigError(s.token_source, f"the coordinator at {s.url} refused this admin token (401); give "
                               "the token the coordinator uses (its ANEX_ADMIN_TOKEN, or <state-dir>/admin-token)")
        if err.status == 404 and what is not None:
            return not_found(*what)
        problem = err.problem or {}
        if err.status in (400, 409, 422) and problem.get("errors"):
            named = []
            for entry in problem["errors"]:
                name = str(entry.get("field", ""))
                top, _, inner = name.partition(".")  # env.GW_TUNNEL_X: the flag of env, and which variable
                flag = (fields or {}).get(top, name) if name else "the request"
                message = str(entry.get("message", ""))
                named.append((flag, f"{inner}: {message}" if inner and top in (fields or {}) else message))
            return ConfigError(named[0][0], "; ".join(f"{m}" if i == 0 else f"{f}: {m}"
                                                      for i, (f, m) in enumerate(named)))
        return err


RESOURCE_OF = {"NODE": "nodes", "GATEWAY": "gateways", "TOKEN_ID": "tokens", "PROVISION": "provisions",
               "MACHINE_ID": "bans"}


def not_found(argument: str, value: str) -> ConfigError:
    """An unknown id or name, and the command that lists what exists."""
    noun = {"NODE": "node", "GATEWAY": "gateway", "TOKEN_ID": "join token", "PROVISION": "provision",
            "MACHINE_ID": "active ban of machine"}.get(argument, argument.lower())
    listing = RESOURCE_OF.get(argument)
    hint = f"; see anex-agent admin {listing} list" if listing else ""
    return ConfigError(argument, f"no {noun} {value!r}{hint}")
