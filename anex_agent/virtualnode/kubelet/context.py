"""What a concern module of the kubelet API server is given: :class:`KubeletContext`.

The server (:mod:`.server`) builds one aiohttp application per virtual Node and assembles its
route table from concern modules, each exposing ``add_routes(app, context)``. By the time a
handler runs, the request has been authenticated (client certificate or bearer token) and
authorized (SubjectAccessReview on the Node's ``nodes/<subresource>``, :mod:`.auth`): handlers
never check who is calling again. ``request[USER_KEY]`` holds the :class:`User` for logs.

A handler that needs the machine behind a pod asks ``context.pods.find(namespace, name)`` for
its :class:`PodTarget` (the pod must be bound to ``context.node_name`` and its provision ready),
or gets a :class:`TargetError` whose ``status`` and ``message`` are fit to answer with as-is
(404 no such pod or container here, 503 the machine is not ready yet). A long-lived stream
(exec, attach, port-forward, a followed log) holds one of ``context.slots`` while it is open
(none free: answer 429).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from anex_agent.errors import AnexError

if TYPE_CHECKING:
    from anex_agent.client.rest import CoordinatorClient
    from anex_agent.tasks import Tasks

#: ``app[CONTEXT_KEY]``: the :class:`KubeletContext` of the application.
CONTEXT_KEY = web.AppKey("kubelet_context", object)


@dataclass(frozen=True)
class User:
    """Who a request came from: a client certificate's CN and O, or a TokenReview's answer."""

    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: dict[str, list[str]] = field(default_factory=dict, hash=False, compare=False)


#: ``request[USER_KEY]``: the :class:`User` the request was authenticated as.
USER_KEY = web.RequestKey("kubelet_user", User) if hasattr(web, "RequestKey") else "kubelet_user"


@dataclass(frozen=True)
class PodTarget:
    """The machine a pod runs on, as the coordinator says it now.

    ``address`` is the node's mesh address (reached through the mesh, never a public port);
    ``ssh_port`` is its SSH server there (0: none); ``api_port`` the agent API there.
    ``containers`` are the pod's container names (today one: the provision's workload)."""

    namespace: str
    name: str
    uid: str
    node_name: str  # the virtual Node the pod is bound to
    provision_id: str
    node_id: str
    address: str
    ssh_port: int
    api_port: int
    containers: tuple[str, ...]

    def has_container(self, container: str) -> bool:
        return container in self.containers


class TargetError(AnexError):
    """No usable target: ``status`` (404, 502, 503) and ``message`` are what the client is answered."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(message)


class PodLocator(Protocol):
    provision_prefix: str

    def bound(self) -> list[Mapping[str, Any]]:
        """The pods bound to this Node, as the virtual node last saw them."""
        ...

    async def find(self, namespace: str, name: str, container: str | None = None) -> PodTarget:
        """The pod's target; with ``container``, also checks that the pod has it (else 404).
        Raises :class:`TargetError`."""
        ...


class Authorizer(Protocol):
    async def authenticate(self, request: web.Request) -> User:
        """The caller, from its verified client certificate or bearer token; ``HTTPUnauthorized`` else."""
        ...

    async def authorize(self, user: User, method: str, path: str) -> None:
        """``HTTPForbidden`` unless ``user`` may ``method`` on ``path`` of this Node (kubelet's mapping)."""
        ...


@dataclass(frozen=True)
class Limits:
    """Bounds of the kubelet port (a stranger may reach it: what it can hold is bounded)."""

    #: streams (exec, attach, port-forward, followed logs) open at once; more answer 429 (:class:`StreamSlots`)
    max_streams: int = 64
    #: a stream with no traffic either way this long is closed (the kubelet's
    #: --streaming-connection-idle-timeout default: 4 hours)
    stream_idle_timeout: float = 4 * 3600.0
    #: a streaming request must have its streams within this long (the kubelet's 30 s)
    stream_creation_timeout: float = 30.0
    #: connecting to a node over the mesh (SSH, agent API) gives up after this long
    connect_timeout: float = 15.0
    #: bytes of a request's headers and body the server reads (no verb here takes a large body)
    max_request_bytes: int = 64 * 1024


class StreamSlots:
    """At most ``limit`` long-lived streams open at once on one Node's port (followed logs, exec,
    attach, port-forward): :meth:`take` before opening one (False: answer 429), :meth:`give` once
    it ended, or ``with slots.held() as ok:``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0

    def take(self) -> bool:
        if self.open >= self.limit:
            return False
        self.open += 1
        return True

    def give(self) -> None:
        self.open = max(self.open - 1, 0)

    @contextmanager
    def held(self) -> Iterator[bool]:
        ok = self.take()
        try:
            yield ok
        finally:
            if ok:
                self.give()


@dataclass(frozen=True)
class KubeletContext:
    """What every concern module of one Node's kubelet server shares (see the module docstring)."""

    node_name: str
    authorizer: Authorizer
    pods: PodLocator
    coordinator: CoordinatorClient
    limits: Limits = Limits()
    #: the role's task owner, for any task a handler must leave running (named, supervised)
    tasks: Tasks | None = None
    #: the long-lived streams open now (limit: ``limits.max_streams``)
    slots: StreamSlots = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.slots is None:
            object.__setattr__(self, "slots", StreamSlots(self.limits.max_streams))
