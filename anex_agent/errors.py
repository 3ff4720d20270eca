"""The one error tree of anex-agent.

Every exception the package raises on purpose derives from :class:`AnexError`; a module may keep
a private one (``_Stop``, ``_Done``: a leading underscore) that never leaves it. Near the root, the
tree separates seven families, defined here, because callers handle them differently:

* :class:`ConfigError` -- bad local input (flags, environment, files). The message
  names the input and says what is accepted. Raised at the edge where config is
  parsed; the CLI prints it and exits with status 2, without a traceback.
* :class:`LocalProtocolError` / :class:`RemoteProtocolError` -- a protocol core
  refused something. *Local* means our own side asked for something the protocol
  does not allow (a bug or misuse); *remote* means the peer sent something invalid.
  Peers never see the text of these exceptions; a server answers a request that does not
  parse with a fixed text and logs the detail (at debug level: peers are not to fill logs).
  :class:`BadRequest` is the remote one of a request that cannot be served; its ``reason`` is
  a designed text fit for the peer (the proxy's and the agent API's 400 body), never a
  library's exception text.
* :class:`CoordinatorError` -- a call to the coordinator failed. ``retryable``
  says whether trying again later may succeed (network errors, 5xx, 429) or not
  (401/403/400: the request itself is wrong).
* :class:`KubeError` -- a call to the Kubernetes API server failed (the virtual node);
  ``status`` and ``retryable`` as for the coordinator, ``forbidden`` for a 403 (a missing
  RBAC permission: logged once, naming the verb and resource).
* :class:`EngineError` -- a tunnel engine could not be brought up or changed.
* :class:`NotSupported` -- a capability is not available on this machine; ``reason``
  says why (engine and path probes, ``anex-agent detect``).
* :class:`DialError` -- a connection for the workload could not be opened
  (:class:`ResolveError`, :class:`DialRefused`, :class:`DialTimeout`,
  :class:`DialUnreachable`); ``reason`` is fit to show the workload.

The whole tree, with the module that defines each error outside this one (a second base in
parentheses is kept for callers that catch it; ``tests/test_errors.py`` checks that every
exception class of the package is drawn here and derives from :class:`AnexError`)::

    AnexError
    ├── ConfigError (ValueError)
    │   ├── PortInUseError
    │   ├── StateDirInUse                host/statelock.py
    │   ├── ProbeError                   agent/probe_spec.py
    │   └── AnnotationError              selection/annotations.py
    ├── ProtocolError
    │   ├── LocalProtocolError
    │   └── RemoteProtocolError
    │       ├── BadRequest (ValueError)
    │       ├── InvalidAccessToken       wire/access_token.py
    │       │   └── TokenReplayed        wire/access_token.py
    │       ├── ProofError (ValueError)  wire/proof.py
    │       ├── RelayProtocolError (ValueError)  net/relay_protocol.py
    │       ├── PacketError (ValueError) netstack/ipv4.py
    │       └── Socks5ProtocolError      frontends/socks5_core.py
    ├── CoordinatorError
    ├── KubeError
    ├── EngineError
    │   └── UapiError                    tunnels/os/uapi.py
    ├── NotSupported
    ├── DialError
    │   ├── ResolveError
    │   ├── DialRefused
    │   ├── DialTimeout
    │   └── DialUnreachable
    ├── HttpError                        net/http/client.py
    │   └── BodyTooLarge                 net/http/client.py
    ├── NetlinkError (OSError)           tunnels/os/rtnl.py
    ├── BindClosed                       tunnels/binds/base.py
    ├── StackError                       netstack/stack.py
    ├── Forbidden                        frontends/dial_guard.py
    ├── PushRefused                      agent/actions.py
    ├── BadParameter (ValueError)        agent/logs_api.py
    ├── NvmlUnavailable                  gpu/nvml.py
    ├── DeviceFailure                    gpu/nvml.py
    ├── ReplayCacheFull                  wire/access_token.py
    ├── Problem                          coordinator/problems.py (an RFC 9457 answer)
    ├── NetworkExhausted                 coordinator/ipam.py
    ├── PublicKeyRefused (ValueError)    coordinator/ssh_ca.py
    ├── SealError                        coordinator/provisioning/registry_auth.py
    ├── BootUnavailable                  coordinator/provisioning/boot.py
    ├── ClientClosed                     coordinator/routes/registry.py
    ├── ProviderError                    providers/offers_http.py
    ├── RentRefused                      providers/rentals.py
    ├── ProviderUnavailable              providers/rentals.py
    │   ├── KeyRefused                   providers/rentals.py
    │   └── NoCapacity                   providers/rentals.py
    ├── WorkerError                      selection/worker.py
    │   ├── WorkerUnavailable            selection/worker.py
    │   ├── WorkerBusy                   selection/worker.py
    │   ├── WorkerTimeout                selection/worker.py
    │   └── JobFailed                    selection/worker.py
    ├── Refusal                          virtualnode/refusal.py
    ├── TargetError                      virtualnode/kubelet/context.py
    ├── BadQuery                         virtualnode/kubelet/logs.py
    ├── StreamsMissing                   virtualnode/kubelet/streams/bridge.py
    ├── NodeUnreachable                  virtualnode/kubelet/streams/node_ssh.py
    ├── DialFailed                       virtualnode/kubelet/streams/portforward.py
    ├── NodeFailure                      virtualnode/kubelet/streams/remotecommand.py
    └── ProcessDied (RuntimeError)       testing/mesh.py (the test and demo harness)

Exceptions from libraries (OSError, aiohttp errors, netlink errors) are translated
into this tree only at I/O edges, never deep inside pure code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class AnexError(Exception):
    """Base of every error anex-agent raises on purpose."""


class ConfigError(AnexError, ValueError):
    """Bad local input. ``str(err)`` names the input and what is accepted."""

    def __init__(self, source: str, message: str) -> None:
        self.source = source
        self.message = message
        super().__init__(f"{source}: {message}")


def config_value(source: str, parser: Callable[..., T], text: str, **options: Any) -> T:
    """``parser(text, **options)`` (a function of :mod:`anex_agent.parse`), its ValueError
    turned into a :class:`ConfigError` naming ``source`` and the input:
    ``--listen: '127.0.0.1:²' must be IP:PORT with ...``."""
    try:
        return parser(text, **options)
    except ValueError as err:
        raise ConfigError(source, f"{text!r} {err}") from None


def env_value(environ: Mapping[str, str], name: str, parser: Callable[..., T], default: T, **options: Any) -> T:
    """The variable ``name`` of ``environ`` read by ``parser`` (see :func:`config_value`), or
    ``default`` when it is unset or empty."""
    text = environ.get(name)
    if text is None or text == "":
        return default
    return config_value(name, parser, text, **options)


def env_number(environ: Mapping[str, str], name: str, default: float, *, minimum: float,
               integer: bool = False) -> float:
    """The variable ``name`` as a number of at least ``minimum`` (:func:`anex_agent.parse.number`),
    ``default`` when unset or empty; else ConfigError naming the variable."""
    from anex_agent import parse

    return env_value(environ, name, parse.number, default, minimum=minimum, integer=integer)


class ProtocolError(AnexError):
    """A protocol core rejected something."""


class LocalProtocolError(ProtocolError):
    """Our side tried something the protocol does not allow."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something invalid (malformed, replayed, unauthenticated)."""


class BadRequest(RemoteProtocolError, ValueError):
    """A peer's request cannot be served as sent. ``reason`` is a designed text fit for the peer
    (the body of a 400): it may quote what the peer sent, never a library's exception text."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class CoordinatorError(AnexError):
    """A coordinator call failed.

    ``status`` is the HTTP status (``None`` when no response came back),
    ``retryable`` whether the same call may succeed later, ``problem`` the
    RFC 9457 problem document the coordinator sent, when it sent one.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = False,
        problem: dict | None = None,
    ) -> None:
        self.status = status
        self.retryable = retryable
        self.problem = problem or {}
        super().__init__(message)


class KubeError(AnexError):
    """A Kubernetes API call failed. ``status`` is the HTTP status (None: no answer), ``retryable``
    whether the same call may succeed later (no answer, 5xx, 429, a 409 conflict), ``reason`` the
    API server's ``reason`` (``NotFound``, ``Conflict``, ``Forbidden``, ``Expired``...)."""

    def __init__(self, message: str, *, status: int | None = None, reason: str = "") -> None:
        self.status = status
        self.reason = reason
        self.retryable = status is None or status >= 500 or status in (409, 429)
        super().__init__(message)

    @property
    def forbidden(self) -> bool:
        return self.status == 403


class EngineError(AnexError):
    """A tunnel engine failed to start, apply a config, or tear down."""


class NotSupported(AnexError):
    """A capability is not available here; ``reason`` says why (for ``detect``)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class DialError(AnexError):
    """Opening an outbound connection failed (raised by :mod:`anex_agent.net.dialer`).

    ``host`` and ``port`` name the destination as the caller gave it; ``reason`` is a
    short, designed, human-readable sentence ("connection refused", "name does not
    resolve") that front-ends may show to the workload (the proxy puts it in the body
    of its 502). It never contains exception text from a library. ``tried`` lists the
    addresses a connection was attempted to, in order (empty when none was: the name did
    not resolve), so a caller can judge where the dial went, not only what it was asked.
    """

    def __init__(self, host: str, port: int, reason: str, *, tried: tuple[str, ...] = ()) -> None:
        self.host = host
        self.port = port
        self.reason = reason
        self.tried = tried
        super().__init__(f"cannot connect to {host}:{port}: {reason}")


class ResolveError(DialError):
    """The destination name does not resolve (NXDOMAIN, no address, DNS unreachable)."""


class DialRefused(DialError):
    """The destination answered with a reset: nothing listens on that port."""


class DialTimeout(DialError):
    """No answer from the destination within the dial timeout."""


class DialUnreachable(DialError):
    """No route to the destination (network or host unreachable)."""


class PortInUseError(ConfigError):
    """A local listener could not bind because the port is taken.

    ``ports`` lists every port that failed (a forward apply reports all at once).
    """

    def __init__(self, source: str, ports: list[int], message: str) -> None:
        self.ports = ports
        super().__init__(source, message)
