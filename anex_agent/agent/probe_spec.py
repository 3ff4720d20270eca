"""The workload's probes as a pod spells them, read once from ``ANEX_PROBES`` (pure).

``ANEX_PROBES`` is a JSON object with up to three keys, ``startup``, ``liveness`` and
``readiness``, each a Kubernetes probe (``core/v1 Probe``) with exactly one handler:

* ``exec``: ``{"command": [ARGV...]}`` (run on the machine with the workload's environment
  and account; status 0 is a success);
* ``httpGet``: ``{"port": N, "path": "/", "host": "127.0.0.1", "scheme": "HTTP"|"HTTPS",
  "httpHeaders": [{"name", "value"}]}`` (a status from 200 to 399 is a success);
* ``tcpSocket``: ``{"port": N, "host": "127.0.0.1"}`` (a connection is a success);

and the timings, with Kubernetes' defaults: ``initialDelaySeconds`` 0, ``periodSeconds`` 10,
``timeoutSeconds`` 1, ``successThreshold`` 1 (always 1 for liveness and startup),
``failureThreshold`` 3, ``terminationGracePeriodSeconds`` (a liveness or startup kill's grace;
default: the agent's ``--grace-period``). Ports are numbers here: the virtual node resolves a
named port against the container's ports before the spec travels. The host defaults to the
loopback address, where the workload listens (a kubelet probes the pod IP; here the workload
and its probes share the machine). :func:`parse` raises ConfigError naming ``ANEX_PROBES`` and
the field (a :class:`ProbeError`, whose ``field`` the virtual node reports when it refuses the
pod). A host must be a host name or an IP address; an exec argument must hold no NUL.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from anex_agent import parse as parse_text
from anex_agent.errors import ConfigError
from anex_agent.wire.pod import PROBES_ENV

SOURCE = PROBES_ENV
KINDS = ("startup", "liveness", "readiness")
HANDLERS = ("exec", "httpGet", "tcpSocket")
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Probe:
    kind: str  # startup | liveness | readiness
    handler: str  # exec | httpGet | tcpSocket
    command: tuple[str, ...] = ()
    port: int = 0
    host: str = LOOPBACK
    path: str = "/"
    scheme: str = "HTTP"
    headers: tuple[tuple[str, str], ...] = ()
    initial_delay: float = 0.0
    period: float = 10.0
    timeout: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3
    grace: float | None = None  # seconds; None: the workload's grace period

    def describe(self) -> str:
        if self.handler == "exec":
            return f"exec {' '.join(self.command)}"
        if self.handler == "httpGet":
            return f"{self.scheme.lower()}-get {self.host}:{self.port}{self.path}"
        return f"tcp-socket {self.host}:{self.port}"


@dataclass(frozen=True)
class ProbeSet:
    startup: Probe | None = None
    liveness: Probe | None = None
    readiness: Probe | None = None

    def __bool__(self) -> bool:
        return any((self.startup, self.liveness, self.readiness))


class ProbeError(ConfigError):
    """A probe field the agent cannot run; ``field`` names it (``liveness.tcpSocket.host``)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(SOURCE, f"{field}: {message}")


def _fail(where: str, message: str) -> ProbeError:
    return ProbeError(where, message)


def _int(raw: dict[str, Any], key: str, where: str, default: int, minimum: int) -> int:
    value = raw.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(f"{where}.{key}", f"{value!r} is not a whole number of at least {minimum}")
    return value


def _port(raw: dict[str, Any], where: str) -> int:
    port = raw.get("port")
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise _fail(f"{where}.port", f"{port!r} is not a port number from 1 to 65535 (the virtual node resolves a "
                    "named port to its number)")
    return port


def _host(raw: dict[str, Any], where: str) -> str:
    host = raw.get("host") or LOOPBACK
    try:
        return parse_text.host(host)
    except ValueError as err:
        raise _fail(f"{where}.host", f"{host!r} {err}") from None


def _probe(kind: str, raw: Any) -> Probe:
    where = kind
    if not isinstance(raw, dict):
        raise _fail(where, "expected a probe object")
    handlers = [h for h in HANDLERS if raw.get(h) is not None]
    if len(handlers) != 1:
        raise _fail(where, f"expected exactly one of {', '.join(HANDLERS)}; got {', '.join(handlers) or 'none'}")
    handler = handlers[0]
    body = raw[handler]
    if not isinstance(body, dict):
        raise _fail(f"{where}.{handler}", "expected an object")
    options: dict[str, Any] = {}
    if handler == "exec":
        command = body.get("command")
        if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
            raise _fail(f"{where}.exec.command", "expected a non-empty list of strings")
        for i, arg in enumerate(command):
            if "\0" in arg:
                raise _fail(f"{where}.exec.command[{i}]", "contains a NUL character, which no program argument can "
                            "hold")
        options["command"] = tuple(command)
    elif handler == "httpGet":
        scheme = str(body.get("scheme") or "HTTP").upper()
        if scheme not in ("HTTP", "HTTPS"):
            raise _fail(f"{where}.httpGet.scheme", f"{scheme!r} is not HTTP or HTTPS")
        path = body.get("path") or "/"
        if not isinstance(path, str) or not path.startswith("/") or any(c.isspace() for c in path):
            raise _fail(f"{where}.httpGet.path", f"{path!r} is not an absolute path without spaces")
        headers = []
        for i, header in enumerate(body.get("httpHeaders") or []):
            if not isinstance(header, dict) or not isinstance(header.get("name"), str) or not header["name"] or \
                    not isinstance(header.get("value", ""), str):
                raise _fail(f"{where}.httpGet.httpHeaders[{i}]", "expected {\"name\": ..., \"value\": ...}")
            headers.append((header["name"], header.get("value", "")))
        options.update(port=_port(body, f"{where}.httpGet"), host=_host(body, f"{where}.httpGet"), path=path,
                       scheme=scheme, headers=tuple(headers))
    else:
        options.update(port=_port(body, f"{where}.tcpSocket"), host=_host(body, f"{where}.tcpSocket"))
    success = _int(raw, "successThreshold", where, 1, 1)
    if kind != "readiness" and success != 1:
        raise _fail(f"{where}.successThreshold", f"must be 1 for a {kind} probe (got {success})")
    grace = raw.get("terminationGracePeriodSeconds")
    return Probe(kind=kind, handler=handler, **options,
                 initial_delay=float(_int(raw, "initialDelaySeconds", where, 0, 0)),
                 period=float(_int(raw, "periodSeconds", where, 10, 1)),
                 timeout=float(_int(raw, "timeoutSeconds", where, 1, 1)),
                 success_threshold=success,
                 failure_threshold=_int(raw, "failureThreshold", where, 3, 1),
                 grace=float(_int(raw, "terminationGracePeriodSeconds", where, 0, 1)) if grace is not None else None)


def parse(text: str | None) -> ProbeSet:
    """The probes of ``ANEX_PROBES`` (unset or empty: none)."""
    if not text:
        return ProbeSet()
    try:
        raw = json.loads(text)
    except ValueError as err:
        raise ConfigError(SOURCE, f"is not JSON ({err.msg} at character {err.pos})") from None
    if not isinstance(raw, dict) or set(raw) - set(KINDS):
        extra = sorted(set(raw) - set(KINDS)) if isinstance(raw, dict) else None
        raise ConfigError(SOURCE, f"expected an object with the keys {', '.join(KINDS)}" +
                          (f"; {', '.join(map(repr, extra))} is not one" if extra else ""))
    probes = {kind: _probe(kind, raw[kind]) for kind in KINDS if raw.get(kind) is not None}
    return ProbeSet(**probes)
