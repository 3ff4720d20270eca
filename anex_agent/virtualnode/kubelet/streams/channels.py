"""The Kubernetes remote-command stream protocols, without I/O: what a kubelet and a client agree on
over SPDY streams or WebSocket channels (``k8s.io/apimachinery/pkg/util/remotecommand``,
``httpstream``, ``wsstream``).

* Negotiation (:func:`negotiate`): the client lists protocols in ``X-Stream-Protocol-Version``
  (SPDY) or ``Sec-WebSocket-Protocol`` (WebSocket), in its order of preference; the first one we
  support wins, as ``httpstream.Handshake`` does. Exec and attach speak ``v5.channel.k8s.io``
  and ``v4.channel.k8s.io`` (v4 and older write other error formats; kubectl and the API server
  always offer v5 and v4 first), port-forward ``portforward.k8s.io`` (SPDY) and
  ``v4.channel.k8s.io`` / ``SPDY/3.1+portforward.k8s.io`` are what the API server tunnels.
* :func:`exec_options`: the query of ``/exec`` and ``/attach`` as the API server writes it for a
  kubelet (``command`` repeated; ``input``, ``output``, ``error``, ``tty`` = ``1``: stdin,
  stdout, stderr, a terminal; ``true`` is taken too), checked as the kubelet does.
* :func:`status_json`: the ``metav1.Status`` the error stream carries at the end (v4/v5), byte
  for byte as the kubelet's JSON encoder writes it.
* :class:`ResizeDecoder`: terminal sizes from the resize stream (back-to-back JSON objects
  ``{"Width":W,"Height":H}``).
* :func:`ws_frame` / :func:`ws_parse`: a WebSocket message is one channel byte and the payload
  (0 stdin, 1 stdout, 2 stderr, 3 error, 4 resize; v5 adds 255 "close": its payload names the
  channel the client will write no more on).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from anex_agent.errors import RemoteProtocolError

V5 = "v5.channel.k8s.io"
V4 = "v4.channel.k8s.io"
EXEC_PROTOCOLS = (V5, V4)
PORT_FORWARD = "portforward.k8s.io"
PORT_FORWARD_WS = ("v4.channel.k8s.io",)  # WebSocket port-forward: data/error channel pairs per port
STREAM_TYPE = "streamtype"  # the SPDY stream header naming what a stream carries
ERROR, STDIN, STDOUT, STDERR, RESIZE, DATA = "error", "stdin", "stdout", "stderr", "resize", "data"
# WebSocket channel numbers (remotecommand/constants.go)
CHANNELS = {STDIN: 0, STDOUT: 1, STDERR: 2, ERROR: 3, RESIZE: 4}
CHANNEL_NAMES = {number: name for name, number in CHANNELS.items()}
CLOSE_CHANNEL = 255  # v5 only
MAX_RESIZE_BUFFER = 4096  # a resize message is some 30 bytes; more unparsed than this is garbage
TRUE_VALUES = frozenset({"1", "true", "True"})
QUERY_FLAGS = ("input", "output", "error", "tty")  # core/v1 ExecStdinParam, ExecStdoutParam, ...


def offered(values: Iterable[str]) -> list[str]:
    """The protocols a client offers: every header value, split on commas, in order."""
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


def negotiate(client: Iterable[str], server: Iterable[str]) -> str | None:
    """The first of the client's protocols that the server supports, or None."""
    supported = tuple(server)
    return next((name for name in offered(client) if name in supported), None)


@dataclass(frozen=True)
class ExecOptions:
    """What ``/exec`` or ``/attach`` asked for; ``stderr`` is False with ``tty`` (one stream)."""

    command: tuple[str, ...]
    stdin: bool
    stdout: bool
    stderr: bool
    tty: bool

    def stream_types(self, protocol: str) -> set[str]:
        """The SPDY streams a client of ``protocol`` opens for these options (error always)."""
        types = {ERROR}
        if self.stdin:
            types.add(STDIN)
        if self.stdout:
            types.add(STDOUT)
        if self.stderr:
            types.add(STDERR)
        if self.tty and protocol in EXEC_PROTOCOLS:
            types.add(RESIZE)
        return types


def exec_options(query: Mapping[str, str] | Iterable[tuple[str, str]], *, needs_command: bool) -> ExecOptions:
    """The options of an ``/exec`` (``needs_command``) or ``/attach`` query.

    Raises ValueError with a line fit for the caller when they make no sense."""
    pairs = list(query.items()) if isinstance(query, Mapping) else list(query)
    command = tuple(value for name, value in pairs if name == "command")
    flags = {name: value for name, value in pairs if name in QUERY_FLAGS}

    def flag(name: str) -> bool:
        return flags.get(name, "") in TRUE_VALUES

    if needs_command and not command:
        raise ValueError("command: at least one command argument is required")
    stdin, stdout, stderr, tty = flag("input"), flag("output"), flag("error"), flag("tty")
    if not (stdin or stdout or stderr):
        raise ValueError("you must specify at least 1 of stdin, stdout, stderr")
    return ExecOptions(command, stdin, stdout, stderr and not tty, tty)


def status_json(exit_code: int | None = 0, *, command: Iterable[str] = (), message: str = "",
                reason: str = "") -> bytes:
    """The ``metav1.Status`` a kubelet writes on the error stream when the command is done.

    ``exit_code`` 0: Success. Another exit code: Failure, reason ``NonZeroExitCode`` and one cause
    ``{"reason": "ExitCode", "message": "<code>"}`` (kubectl then exits with that code), the message
    as the kubelet's runtimes word it for ``command``. None:
    Failure with ``message`` (and ``reason``, e.g. ``InternalError``): the command could not run."""
    if exit_code == 0:
        status: dict = {"metadata": {}, "status": "Success"}
    elif exit_code is not None:
        status = {"metadata": {}, "status": "Failure",
                  "message": message or "command terminated with non-zero exit code: error executing command "
                                        f"[{' '.join(command)}], exit code {exit_code}",
                  "reason": "NonZeroExitCode",
                  "details": {"causes": [{"reason": "ExitCode", "message": str(exit_code)}]}}
    else:
        status = {"metadata": {}, "status": "Failure", "message": message}
        if reason:
            status["reason"] = reason
    return json.dumps(status, separators=(",", ":")).encode()


class ResizeDecoder:
    """Terminal sizes as they come on the resize stream: feed bytes, get (width, height) pairs."""

    def __init__(self) -> None:
        self._buffer = ""
        self._decoder = json.JSONDecoder()

    def feed(self, data: bytes) -> list[tuple[int, int]]:
        try:
            self._buffer += data.decode()
        except UnicodeDecodeError:
            raise RemoteProtocolError("resize stream is not UTF-8") from None
        sizes = []
        while True:
            text = self._buffer.lstrip()
            if not text:
                self._buffer = ""
                return sizes
            try:
                value, end = self._decoder.raw_decode(text)
            except json.JSONDecodeError:
                if len(text) > MAX_RESIZE_BUFFER:
                    raise RemoteProtocolError("resize stream is not JSON") from None
                self._buffer = text
                return sizes
            self._buffer = text[end:]
            if not isinstance(value, dict):
                raise RemoteProtocolError("resize message is not an object")
            width, height = value.get("Width", 0), value.get("Height", 0)
            if not (isinstance(width, int) and isinstance(height, int)) or not (0 <= width < 65536 and 0 <= height < 65536):
                raise RemoteProtocolError("resize message has bad Width/Height")
            if width and height:
                sizes.append((width, height))


def ws_frame(channel: int, data: bytes) -> bytes:
    """One binary WebSocket message for ``channel``."""
    return bytes([channel]) + data


def ws_parse(message: bytes) -> tuple[int, bytes]:
    """The channel and payload of a client's WebSocket message."""
    if not message:
        raise RemoteProtocolError("empty WebSocket message (no channel byte)")
    return message[0], message[1:]
