"""Selection settings, parsed once at the edge from the environment (the coordinator's).

| variable | default | meaning |
|---|---|---|
| ``ANEX_VASTAI_API_KEY`` | unset | Vast.AI API key; Vast.AI is asked only when set (or a URL is set) |
| ``ANEX_VASTAI_API_KEY_FILE`` | unset | a file holding the Vast.AI API key (instead of the variable) |
| ``ANEX_VASTAI_URL`` | ``https://console.vast.ai/api/v0`` | Vast.AI API base |
| ``ANEX_RUNPOD_API_KEY`` | unset | RunPod API key; RunPod is asked only when set (or a URL is set) |
| ``ANEX_RUNPOD_API_KEY_FILE`` | unset | a file holding the RunPod API key (instead of the variable) |
| ``ANEX_RUNPOD_URL`` | ``https://api.runpod.io/graphql`` | RunPod GraphQL endpoint |
| ``ANEX_SELECTION_BAN_SECONDS`` | 3600 | how long a provisioning failure bans a Vast.AI machine |
| ``ANEX_SELECTION_CACHE_TTL`` | 30 | seconds a provider answer is reused |
| ``ANEX_SELECTION_TIMEOUT`` | 15 | seconds per provider request |
| ``ANEX_SELECTION_ATTEMPTS`` | 4 | tries per provider request (429/5xx/timeouts retried) |
| ``ANEX_SELECTION_ORDERING`` | ``price`` | ``price`` or ``prefer-onprem`` (pods override with ``anex.sh/ordering``) |
| ``ANEX_SELECTION_QUALIFICATION`` | ``runnable`` | qualification policy of on-prem nodes without a ``qualification`` label (see :mod:`.qualification`) |

On-prem nodes are always a source. Keys are never logged and never shown by ``repr``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from anex_agent.host.config_secrets import SecretSpec, pick_secret
from anex_agent.errors import ConfigError, env_number
from anex_agent.selection.bans import DEFAULT_BAN_SECONDS
from anex_agent.providers.offers_http import HttpPolicy
from anex_agent.selection.qualification import DEFAULT_POLICY, parse_policy
from anex_agent.selection.rank import ORDERINGS, PRICE
from anex_agent.providers.runpod.offers import DEFAULT_URL as RUNPOD_URL, RunPodConfig
from anex_agent.providers.vastai.offers import DEFAULT_URL as VASTAI_URL, VastAIConfig


# how to switch on a provider that is not configured, for answers that say it is not
HOW_TO_CONFIGURE = {
    "vastai": "set ANEX_VASTAI_API_KEY (or ANEX_VASTAI_API_KEY_FILE, a file holding the key) in the coordinator's "
              "environment and restart it",
    "runpod": "set ANEX_RUNPOD_API_KEY (or ANEX_RUNPOD_API_KEY_FILE, a file holding the key) in the coordinator's "
              "environment and restart it",
}


def not_configured(name: str) -> str:
    """Why provider ``name`` gave no offers when it is not configured, and what to do."""
    how = HOW_TO_CONFIGURE.get(name)
    return f"{name} is not configured on this coordinator" + (f": {how}" if how else "")


@dataclass(frozen=True)
class SelectionConfig:
    vastai: VastAIConfig | None = None
    runpod: RunPodConfig | None = None
    ban_seconds: float = DEFAULT_BAN_SECONDS
    policy: HttpPolicy = field(default_factory=HttpPolicy)
    ordering: str = PRICE  # for pods without anex.sh/ordering
    qualification: str = DEFAULT_POLICY  # for on-prem nodes without a qualification label

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> "SelectionConfig":
        policy = HttpPolicy(timeout=env_number(environ, "ANEX_SELECTION_TIMEOUT", 15.0, minimum=0.1),
                            attempts=int(env_number(environ, "ANEX_SELECTION_ATTEMPTS", 4, minimum=1, integer=True)),
                            cache_ttl=env_number(environ, "ANEX_SELECTION_CACHE_TTL", 30.0, minimum=0))
        vast_key = pick_secret(SecretSpec(None, "ANEX_VASTAI_API_KEY"), environ)[0] or ""
        runpod_key = pick_secret(SecretSpec(None, "ANEX_RUNPOD_API_KEY"), environ)[0] or ""
        vast_url, runpod_url = environ.get("ANEX_VASTAI_URL", ""), environ.get("ANEX_RUNPOD_URL", "")
        for name, url in (("ANEX_VASTAI_URL", vast_url), ("ANEX_RUNPOD_URL", runpod_url)):
            if url and not url.startswith(("http://", "https://")):
                raise ConfigError(name, f"{url!r} is not an http(s) URL")
        ordering = (environ.get("ANEX_SELECTION_ORDERING") or PRICE).strip().lower()
        if ordering not in ORDERINGS:
            raise ConfigError("ANEX_SELECTION_ORDERING", f"{ordering!r} is not valid; accepted: "
                                                         f"{' or '.join(ORDERINGS)}")
        policy_text = (environ.get("ANEX_SELECTION_QUALIFICATION") or DEFAULT_POLICY).strip().lower()
        try:
            parse_policy(policy_text)
        except ValueError as err:
            raise ConfigError("ANEX_SELECTION_QUALIFICATION", str(err)) from None
        return cls(
            vastai=VastAIConfig(api_key=vast_key, base_url=vast_url or VASTAI_URL, policy=policy)
            if (vast_key or vast_url) else None,
            runpod=RunPodConfig(api_key=runpod_key, url=runpod_url or RUNPOD_URL, policy=policy)
            if (runpod_key or runpod_url) else None,
            ban_seconds=env_number(environ, "ANEX_SELECTION_BAN_SECONDS", DEFAULT_BAN_SECONDS, minimum=1),
            policy=policy,
            ordering=ordering,
            qualification=policy_text,
        )
