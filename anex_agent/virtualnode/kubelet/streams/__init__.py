"""The kubelet API's streaming verbs on rented pods: exec, attach and port-forward (docs/kubernetes.md).

:func:`add_routes` puts ``/exec/{namespace}/{pod}/{container}``, ``/attach/...`` and
``/portForward/{namespace}/{pod}`` (GET and POST, with or without the pod uid segment, as the
kubelet serves them) on one Node's kubelet application; the server's middleware has already
authenticated and authorized the caller. Each request is checked before it is upgraded (the
options, the protocol, the pod and its machine, the bounds) and answered with the kubelet's
status and wording when something is wrong; then it is upgraded to SPDY/3.1 (exec and attach
also to a WebSocket, ``v5.channel.k8s.io``/``v4.channel.k8s.io``: :mod:`.websocket`) and bridged
to the node over the mesh (:mod:`.remotecommand`, :mod:`.portforward`, through :mod:`.node_ssh`).

Bounds: each streaming request holds one of the Node's stream slots (``context.slots``,
:attr:`~..context.Limits.max_streams`, shared with followed logs) and one of :data:`MAX_PER_POD`
per pod (none free: 429); a session idle for
:attr:`~..context.Limits.stream_idle_timeout` is closed; the client's streams must come within
:attr:`~..context.Limits.stream_creation_timeout`.
"""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from aiohttp import web

from anex_agent.errors import CoordinatorError
from anex_agent.virtualnode.kubelet.context import USER_KEY, KubeletContext, PodTarget, StreamSlots, TargetError
from anex_agent.virtualnode.kubelet.streams import channels, node_ssh, portforward, remotecommand, websocket
from anex_agent.virtualnode.kubelet.streams.bridge import StreamsMissing, collect_streams, run_bridged
from anex_agent.virtualnode.kubelet.streams.session import SpdySession
from anex_agent.virtualnode.kubelet.streams.upgrade import PROTOCOL_HEADER, spdy_headers, upgrade, wants_spdy

log = logging.getLogger(__name__)

MAX_PER_POD = 16  # streaming requests open at once on one pod

# connect(target, requested_for, features) -> an asyncssh client connection to the pod's node
Connect = Callable[[PodTarget, str], Any]


class Gate:
    """Holds one of the Node's stream slots (shared with followed logs) and one of the pod's."""

    def __init__(self, slots: StreamSlots, per_pod: int) -> None:
        self.slots, self.per_pod = slots, per_pod
        self.open: collections.Counter[str] = collections.Counter()

    @contextlib.contextmanager
    def hold(self, pod: str) -> Iterator[bool]:
        """Yields False (and holds nothing) when a bound is reached."""
        if self.open[pod] >= self.per_pod or not self.slots.take():
            yield False
            return
        self.open[pod] += 1
        try:
            yield True
        finally:
            self.slots.give()
            self.open[pod] -= 1
            if not self.open[pod]:
                del self.open[pod]


def _text(status: int, text: str, **headers: str) -> web.Response:
    return web.Response(status=status, text=text, content_type="text/plain", headers=headers)


def _refuse_protocol(offered: list[str], supported: tuple[str, ...]) -> web.Response:
    # httpstream.Handshake's answer: 403 naming both lists, and the accepted ones in a header
    return _text(403, f"unable to upgrade: unable to negotiate protocol: client supports {offered}, "
                      f"server supports {list(supported)}",
                 **{"X-Accepted-Stream-Protocol-Versions": ", ".join(supported)})


class Handlers:
    def __init__(self, context: KubeletContext, connect: Connect | None = None) -> None:
        self.context = context
        self.gate = Gate(context.slots, MAX_PER_POD)
        self.connect = connect or self._ssh_connect

    async def _ssh_connect(self, target: PodTarget, requested_for: str, features: list[str]) -> Any:
        return await node_ssh.connect(self.context.coordinator, target, requested_for=requested_for,
                                      timeout=self.context.limits.connect_timeout, features=features)

    def _who(self, request: web.Request, verb: str, target: PodTarget) -> str:
        user = request.get(USER_KEY)
        name = getattr(user, "name", "") or "unknown"
        return f"kubectl {verb} {target.namespace}/{target.name} by {name} via {self.context.node_name}"

    async def _prepare(self, request: web.Request, supported: tuple[str, ...], container: str | None, *,
                       websockets: bool = False) -> tuple[str, dict[str, str], PodTarget] | web.Response:
        """(protocol, the 101's headers, target), or the answer refusing the request."""
        if wants_spdy(request):
            offered = channels.offered(request.headers.getall(PROTOCOL_HEADER, []))
            protocol = channels.negotiate(offered, supported)
            if protocol is None:
                return _refuse_protocol(offered, supported)
            headers = spdy_headers(protocol)
        elif websockets and websocket.wants_websocket(request):
            answer = websocket.handshake(request, supported)
            if isinstance(answer, web.Response):
                return answer
            protocol, headers = answer
        else:
            return _text(400, "Upgrade request required: this endpoint speaks SPDY/3.1 (Connection: Upgrade, "
                              "Upgrade: SPDY/3.1)" + (" or a WebSocket" if websockets else ""))
        try:
            target = await self.context.pods.find(request.match_info["namespace"], request.match_info["pod"],
                                                  container)
        except TargetError as err:
            return _text(err.status, err.message)
        return protocol, headers, target

    async def exec(self, request: web.Request) -> web.StreamResponse:
        return await self._remote_command(request, attach=False)

    async def attach(self, request: web.Request) -> web.StreamResponse:
        return await self._remote_command(request, attach=True)

    async def _remote_command(self, request: web.Request, *, attach: bool) -> web.StreamResponse:
        verb = "attach" if attach else "exec"
        try:
            options = channels.exec_options(request.query.items(), needs_command=not attach)
        except ValueError as err:
            return _text(400, str(err))
        if attach and options.stdin:
            return _text(400, "attach: the workload's stdin cannot be attached on rented pods (the node "
                              "does not pipe it); attach without -i, or use kubectl exec -i")
        container = request.match_info["container"]
        prepared = await self._prepare(request, channels.EXEC_PROTOCOLS, container, websockets=True)
        if isinstance(prepared, web.Response):
            return prepared
        protocol, headers, target = prepared
        key = f"{target.namespace}/{target.name}"
        with self.gate.hold(key) as admitted:
            if not admitted:
                return _text(429, f"too many streams open on pod {key} or this node; try again later")
            pipe = await upgrade(request, headers)
            where = f"node {target.node_id}"
            limits = self.context.limits
            session: SpdySession | websocket.WsSession
            if wants_spdy(request):
                session = SpdySession(pipe.reader, pipe, name=f"{verb} {key}")
            else:
                session = websocket.WsSession(pipe.reader, pipe, protocol, options.stream_types(protocol),
                                              name=f"{verb} {key} (WebSocket)")

            async def body() -> None:
                if isinstance(session, websocket.WsSession):
                    streams: dict[str, Any] = dict(session.streams)
                else:
                    try:
                        streams = await collect_streams(session, options.stream_types(protocol),
                                                        limits.stream_creation_timeout)
                    except StreamsMissing as err:
                        log.info("%s: %s", session.name, err)
                        return
                if attach:
                    await remotecommand.attach_body(streams, options, self._follow(target), where)
                    return
                connection: list[Any] = []

                async def open_process(command: str, term: str | None, size: tuple[int, int] | None) -> Any:
                    try:
                        conn = await self.connect(target, self._who(request, verb, target),
                                                  ["pty"] if options.tty else [])
                    except node_ssh.NodeUnreachable as err:
                        raise remotecommand.NodeFailure(str(err)) from None
                    connection.append(conn)
                    try:
                        return await conn.create_process(command, term_type=term, term_size=size, encoding=None)
                    except Exception as err:  # asyncssh refused the session (ChannelOpenError and kin)
                        raise remotecommand.NodeFailure(f"{where}: the command could not start: {err}") from None

                try:
                    await remotecommand.exec_body(streams, options, open_process, where)
                finally:
                    for conn in connection:
                        conn.close()  # the channel closes with it: the node hangs the command up

            log.info("%s: %s started (%s)", session.name, verb, protocol)
            await run_bridged(session, body, idle_timeout=limits.stream_idle_timeout)
            log.info("%s: %s ended", session.name, verb)
            return pipe.response

    def _follow(self, target: PodTarget) -> Callable[[str | None], AsyncIterator[bytes]]:
        def follow(stream: str | None) -> AsyncIterator[bytes]:
            params: dict[str, str | int] = {"follow": 1, "tail": 0}
            if stream:
                params["stream"] = stream
            return self.context.coordinator.node_logs(target.node_id, **params)
        return follow

    async def port_forward(self, request: web.Request) -> web.StreamResponse:
        prepared = await self._prepare(request, (channels.PORT_FORWARD,), None)
        if isinstance(prepared, web.Response):
            return prepared
        _protocol, headers, target = prepared
        key = f"{target.namespace}/{target.name}"
        with self.gate.hold(key) as admitted:
            if not admitted:
                return _text(429, f"too many streams open on pod {key} or this node; try again later")
            pipe = await upgrade(request, headers)
            session = SpdySession(pipe.reader, pipe, name=f"port-forward {key}")
            connection: list[Any] = []

            async def dial(port: int) -> tuple[Any, Any]:
                try:
                    if not connection:
                        connection.append(await self.connect(target, self._who(request, "port-forward", target),
                                                             ["port-forwarding"]))
                    return await connection[0].open_connection("127.0.0.1", port,
                                                               max_pktsize=portforward.CHANNEL_PACKET)
                except node_ssh.NodeUnreachable as err:
                    raise portforward.DialFailed(str(err)) from None
                except (OSError, CoordinatorError) as err:
                    raise portforward.DialFailed(str(err)) from None
                except Exception as err:  # asyncssh: the node refused the channel (nothing listens there)
                    raise portforward.DialFailed(getattr(err, "reason", "") or str(err) or type(err).__name__) from None

            async def body() -> None:
                try:
                    await portforward.forward_body(session, dial, target.name, target.uid)
                finally:
                    for conn in connection:
                        conn.close()

            log.info("%s: port-forward started", session.name)
            await run_bridged(session, body, idle_timeout=self.context.limits.stream_idle_timeout)
            log.info("%s: port-forward ended", session.name)
            return pipe.response


def add_routes(app: web.Application, context: KubeletContext, *, connect: Connect | None = None) -> None:
    """The streaming routes of one Node (see the module docstring); ``connect`` replaces the SSH
    connection to a pod's node (tests)."""
    handlers = Handlers(context, connect)
    for method in ("GET", "POST"):
        app.router.add_route(method, "/exec/{namespace}/{pod}/{container}", handlers.exec)
        app.router.add_route(method, "/exec/{namespace}/{pod}/{uid}/{container}", handlers.exec)
        app.router.add_route(method, "/attach/{namespace}/{pod}/{container}", handlers.attach)
        app.router.add_route(method, "/attach/{namespace}/{pod}/{uid}/{container}", handlers.attach)
        app.router.add_route(method, "/portForward/{namespace}/{pod}", handlers.port_forward)
        app.router.add_route(method, "/portForward/{namespace}/{pod}/{uid}", handlers.port_forward)
