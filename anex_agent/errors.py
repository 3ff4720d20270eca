"""The one error tree of anex-agent.

Every exception the package raises on purpose derives from :class:`AnexError`.
The tree separates seven families, because callers handle them differently:

* :class:`ConfigError` -- bad local input (flags, environment, files). The message
  names the input and says what is accepted. Raised at the edge where config is
  parsed; the CLI prints it and exits with status 2, without a traceback.
* :class:`LocalProtocolError` / :class:`RemoteProtocolError` -- a protocol core
  refused something. *Local* means our own side asked for something the protocol
  does not allow (a bug or misuse); *remote* means the peer sent something invalid.
  Peers never see the text of these exceptions.
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

:class:`PortInUseError` is a :class:`ConfigError` (a listen port that is taken).

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
