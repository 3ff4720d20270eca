"""Wire models of the provisioning routes (``/v1/provisions``), shared by the coordinator and its clients
(the coordinator client, the virtual node): one module of JSON models used by both sides, beside the
other wire models (:mod:`anex_agent.wire`).

    POST   /v1/provisions            admin  ProvisionCreate -> ProvisionView (202; the same name and body: the
                                            existing provision, 200; the same name, another body: 409)
    GET    /v1/provisions            admin  -> ProvisionList
    GET    /v1/provisions/{id}       admin  -> ProvisionView (with every attempt)
    DELETE /v1/provisions/{id}       admin  -> ProvisionView (202; idempotent)
    GET    /v1/provisions/watch      admin  WebSocket of ProvisionEvent

States: ``selecting`` -> ``renting`` -> ``booting`` -> ``ready``; ``failed`` (``reason`` says why);
``lost`` (the provider took the machine back: the node was revoked); ``released`` (its GPUs stayed
idle for the idle window: the machine was destroyed); ``deleting`` -> ``deleted``. A recovery policy
(annotations ``anex.sh/retry-on``, ``anex.sh/retry-for``: docs/provisioning.md) may send a failed or
lost provision back to ``selecting``.
"""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Annotated, Literal

from pydantic import Field, field_validator

from anex_agent.wire.base import NAME_MAX, Model

ENV_MAX = 128  # variables
ENV_VALUE_MAX = 4096
ARGS_MAX = 256
ARG_MAX = 4096
IMAGE_MAX = 512
NAME_PATTERN = r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$"  # a DNS label-ish name, as Kubernetes pod names


class ProvisionState(str, Enum):
    selecting = "selecting"
    renting = "renting"
    booting = "booting"
    ready = "ready"
    failed = "failed"
    lost = "lost"
    released = "released"
    deleting = "deleting"
    deleted = "deleted"


LIVE_STATES = frozenset({ProvisionState.selecting, ProvisionState.renting, ProvisionState.booting,
                         ProvisionState.ready})
WORK_STATES = LIVE_STATES - {ProvisionState.ready} | {ProvisionState.deleting}  # the loop acts on these


class RegistryAuth(Model):
    """A login to the registry of a private image (a pod's ``imagePullSecrets``). Secret: the
    coordinator stores it sealed and never answers it back."""

    server: str = Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9.:\[\]-]+$",
                        description="the registry's host[:port], e.g. ghcr.io or docker.io")
    username: str = Field(min_length=1, max_length=256)
    password: str = Field(min_length=1, max_length=8192, repr=False)

    @field_validator("server", "username", "password")
    @classmethod
    def _one_word(cls, value: str) -> str:
        """Each is one word of ``docker login``'s arguments (Vast.AI's ``image_login`` is
        ``-u USER -p PASSWORD SERVER``, split at spaces, with no quoting): a space would split it, a
        leading ``-`` would be read as an option."""
        if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in value):
            raise ValueError("must not hold spaces or control characters")
        if value.startswith("-"):
            raise ValueError("must not start with '-'")
        return value


class ProvisionCreate(Model):
    """What to provision. ``name`` is unique among provisions not deleted and makes the request
    idempotent: sending the same body again answers the existing provision."""

    name: str = Field(min_length=1, max_length=NAME_MAX, pattern=NAME_PATTERN)
    annotations: dict[Annotated[str, Field(max_length=316)], Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=dict, max_length=256,
        description="the pod's annotations: the selection reads anex.sh/, vastai.anex.sh/, runpod.anex.sh/ keys")
    image: str = Field(min_length=1, max_length=IMAGE_MAX, description="container image to run")
    command: list[Annotated[str, Field(max_length=ARG_MAX)]] = Field(
        default_factory=list, max_length=ARGS_MAX, description="the pod's command, run under the agent")
    args: list[Annotated[str, Field(max_length=ARG_MAX)]] = Field(default_factory=list, max_length=ARGS_MAX)
    env: dict[Annotated[str, Field(min_length=1, max_length=256)], Annotated[str, Field(max_length=ENV_VALUE_MAX)]] = \
        Field(default_factory=dict, max_length=ENV_MAX,
              description="the workload's environment, GW_TUNNEL_<port>=HOST:PORT forwards included")
    ports: list[Annotated[int, Field(ge=1, le=65535)]] = Field(default_factory=list, max_length=64)
    disk_gb: float | None = Field(None, gt=0, le=100_000, description="disk to allocate; default: the "
                                  "anex.sh/disk annotation, else 20")
    registry_auth: RegistryAuth | None = Field(
        None, description="the login the provider uses to pull a private image (Vast.AI image_login, RunPod "
        "container registry auth); stored sealed, never answered back")
    agent: Literal["entrypoint", "download"] | None = Field(
        None, description="how the agent starts on the machine: entrypoint (the image's entrypoint is the agent; "
        "it gets the join token in its environment) or download (a start script fetches the single-file agent "
        "from the coordinator, checks its hash and runs the command under it; needs the coordinator's "
        "--agent-binary and a command). Default: download when the coordinator serves an agent file, else "
        "entrypoint")


class AttemptView(Model):
    """One try at one offer, and how it ended."""

    number: int
    provider: str
    offer_id: str
    machine_id: str | None = None
    price_per_hour: float | None = Field(None, description="USD/hour of the offer")
    rental_id: str | None = None
    started_at: datetime
    rented_at: datetime | None = None
    ended_at: datetime | None = None
    outcome: str | None = Field(None, description="null while running; refused, unavailable, boot_timeout, "
                                "deadline (a boot phase past its deadline, named in reason), interrupted (outbid or "
                                "preempted), unhealthy (a GPU fault), lost, idle, deleted, failed")
    reason: str | None = None
    event: str | None = Field(None, description="the recovery event the outcome is: no-capacity, error, "
                              "interruption; null when none")
    running_at: datetime | None = Field(None, description="when the provider first reported the machine running")
    joined_at: datetime | None = Field(None, description="when the machine's agent joined")
    cost_usd: float = Field(0.0, description="what this rental cost so far (price x time rented)")


class ProvisionView(Model):
    id: str
    name: str
    state: ProvisionState
    reason: str | None = Field(None, description="why it failed, was lost, or what it waits for")
    image: str
    agent: str = Field("entrypoint", description="how the agent starts: entrypoint or download")
    annotations: dict[str, str]
    created_at: datetime
    updated_at: datetime
    provider: str | None = None
    offer_id: str | None = None
    rental_id: str | None = None
    price_per_hour: float | None = Field(None, description="USD/hour of the current rental")
    cost_usd: float = Field(0.0, description="running cost of every rental of this provision so far, USD")
    node_id: str | None = None
    address: str | None = Field(None, description="the node's mesh address once it joined")
    ready_at: datetime | None = None
    attempts: list[AttemptView] = Field(default_factory=list)
    retries: int = Field(0, description="retries the recovery policy started since the provision was last ready")
    next_retry_at: datetime | None = Field(None, description="when the next retry starts (waiting for it)")
    idle_since: datetime | None = Field(None, description="since when every GPU of the ready machine is below the "
                                        "idle threshold (anex.sh/idle-release counts from then)")


class ProvisionList(Model):
    provisions: list[ProvisionView]


class ProvisionEvent(Model):
    """One event of ``/v1/provisions/watch``: a ``snapshot`` first (every provision), then ``changed``."""

    type: str
    version: int
    provisions: list[ProvisionView] | None = None
    provision: ProvisionView | None = None
