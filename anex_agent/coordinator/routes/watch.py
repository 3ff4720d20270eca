"""GET /v1/watch?since=N: the WebSocket change stream for gateways and nodes.

Protocol (JSON text frames, each a :class:`~anex_agent.wire.watch.WatchEvent`; see its docstring):
* gateways: a ``snapshot`` of the full peer set when ``since`` is 0, older than the
  retained change log or newer than the head; else the missed ``peer_added`` /
  ``peer_removed`` events in order. Then live events.
* nodes: a ``snapshot`` (``since`` = 0, newer than the head or older than the retained
  change log) or, when its config changed after ``since``, one ``config`` event with the full
  config, and the ``ssh_revoked`` events after ``since``; then ``config`` /
  ``gateway_changed`` / ``ssh_revoked`` events. After a snapshot a node fetches its revoked
  SSH certificates (``GET /v1/nodes/{id}/ssh-revocations``).
* A gateway's open stream is its sign of life (``last_seen_at`` written every
  :func:`.gateways.touch_interval` s, see :mod:`.gateways` for when a gateway is gone); a
  gateway that was gone is back when its stream opens.
* Every event's ``version`` only grows; a client resumes with ``since=<last version>``.
* The server closes with code 4001 when the caller's credential is revoked (node or
  gateway deleted, or re-joined with a new credential), 1001 when it shuts down, 1012 when
  this process missed pruned changes (the client resumes with ``since`` and gets a snapshot).
* A watcher that does not keep up is closed with 1012 too: when its queue of pending
  changes is full (``Limits.watch_queue``) or one event does not reach its socket within
  ``Limits.watch_send_timeout``. The coordinator holds at most that many changes per
  watcher; a closing handshake the watcher does not read within ``CLOSE_TIMEOUT`` ends
  with the connection being dropped.

The caller subscribes to the in-process feed *before* reading its starting point, and
skips queued changes at or below the version it already sent, so nothing falls
between the backlog and the live stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiohttp import WSMsgType, web

from anex_agent import parse
from anex_agent.wire.gateways import MeshPeer
from anex_agent.wire.nodes import NodeConfig
from anex_agent.wire.watch import SshRevocation, WatchEvent
from anex_agent.coordinator import changes, credentials, gateways, nodes, problems
from anex_agent.coordinator.auth import Auth, bearer
from anex_agent.coordinator.routes.registry import Call, QueryParam, Route, RouteRegistry

log = logging.getLogger(__name__)

CLOSE_REVOKED = 4001
CLOSE_RESYNC = 1012  # "service restart": the feed skipped pruned changes; reconnect with since for a snapshot
WS_HEARTBEAT = 20.0  # seconds between pings; a dead client is dropped after a missed pong
CLOSE_TIMEOUT = 2.0  # seconds a close frame may wait for a watcher that does not read


def _since(request: web.Request) -> int:
    raw = request.query.get("since", "0")
    try:
        return parse.integer(raw)
    except ValueError:
        raise problems.Problem(
            422, "Unprocessable Content", "since must be a non-negative integer version", slug="validation",
            errors=[{"field": "since", "message": "must be a non-negative integer (0 for a snapshot)"}],
        ) from None


async def _send(ws: web.WebSocketResponse, event: WatchEvent) -> None:
    await ws.send_str(event.model_dump_json(exclude_none=True))


async def _gateway_start(ctx, ws: web.WebSocketResponse, gateway_id: str, since: int) -> int:
    async with ctx.db.transaction() as tx:
        back = await gateways.seen(ctx, tx, gateway_id, ctx.clock())
        if back is None:
            raise problems.not_found(f"gateway {gateway_id}")
        head = await changes.current_version(tx)
        pruned = await changes.pruned_through(tx)
        if since == 0 or since < pruned or since > head:
            snapshot = await gateways.peer_set(tx)
            rows = None
        else:
            rows = await tx.fetch(
                "SELECT version, scope, target, type, payload FROM changes"
                " WHERE scope = $1 AND version > $2 AND version <= $3 ORDER BY version",
                changes.Scope.ALL_GATEWAYS.value, since, head,
            )
    if back:
        ctx.committed()  # the nodes' configs list it again
    if rows is None:
        await _send(ws, WatchEvent(type="snapshot", version=snapshot.version, peers=snapshot.peers))
        return snapshot.version
    for row in rows:
        await _send(ws, _gateway_event(changes.Change.from_row(row)))
    return head


def _gateway_event(change: changes.Change) -> WatchEvent:
    return WatchEvent(type=change.type.value, version=change.version, peer=MeshPeer.model_validate(change.payload))


async def _node_start(ctx, ws: web.WebSocketResponse, node_id: str, since: int) -> tuple[int, NodeConfig]:
    config = await nodes.config(ctx, node_id)
    async with ctx.db.transaction() as tx:
        head = await changes.current_version(tx)
        pruned = await changes.pruned_through(tx)
        revoked = [] if since == 0 else await tx.fetch(
            "SELECT version, scope, target, type, payload FROM changes"
            " WHERE scope = $1 AND target = $2 AND type = $3 AND version > $4 AND version <= $5 ORDER BY version",
            changes.Scope.ONE_NODE.value, node_id, changes.ChangeType.SSH_REVOKED.value, since, head,
        )
    # a node's ``since`` may be past its config version (an ``ssh_revoked`` event), never past the head
    if since == 0 or since > head or since < pruned:
        await _send(ws, WatchEvent(type="snapshot", version=config.version, config=config))
        return config.version, config
    if config.version > since:
        await _send(ws, WatchEvent(type="config", version=config.version, config=config))
    for row in revoked:  # missed revocations: the node refuses these serials from now on
        await _send(ws, _revoked_event(changes.Change.from_row(row)))
    return max(since, config.version, *(int(r["version"]) for r in revoked)), config


def _revoked_event(change: changes.Change) -> WatchEvent:
    return WatchEvent(type="ssh_revoked", version=change.version,
                           ssh_revoked=SshRevocation.model_validate(change.payload))


async def _still_valid(ctx, kind: str, ident: str, credential_hash: str) -> bool:
    table = "nodes" if kind == "node" else "gateways"
    found = await ctx.db.fetchval(f"SELECT id FROM {table} WHERE id = $1 AND credential_hash = $2", ident, credential_hash)
    return found is not None


async def _pump(
    ctx,
    ws: web.WebSocketResponse,
    sub: changes.Subscription,
    last: int,
    credential_hash: str,
    config: NodeConfig | None,
    send_timeout: float,
) -> int:
    """Forward queued changes as events; return the close code when the stream must end
    (:data:`CLOSE_REVOKED`: the caller's credential is revoked; :data:`CLOSE_RESYNC`).

    Nodes: a change of their own config is read from the database; a gateway-set change
    reuses the node's own part of the last config sent and the process-wide gateway memo.
    """
    try:
        return await _pump_events(ctx, ws, sub, last, credential_hash, config, send_timeout)
    except TimeoutError:  # one event did not reach the socket in time: the watcher does not read
        sub.overflowed = True  # it did not keep up; nothing more is queued for it
        return CLOSE_RESYNC


async def _pump_events(ctx, ws, sub, last, credential_hash, config, send_timeout) -> int:
    async def send(event: WatchEvent) -> None:
        async with asyncio.timeout(send_timeout):
            await _send(ws, event)

    while True:
        change: changes.Change = await sub.queue.get()
        if change.scope == changes.Scope.RESYNC:
            return CLOSE_RESYNC
        if change.version <= last:
            continue
        if change.type in changes.REVOKING and change.scope in (changes.Scope.ONE_NODE, changes.Scope.ONE_GATEWAY):
            # a re-join that happened before this stream opened (with the credential in use
            # here) may reach the feed after it: close only if our credential is really gone
            if await _still_valid(ctx, sub.kind, sub.ident, credential_hash):
                continue
            return CLOSE_REVOKED
        if sub.kind == "gateway":
            await send(_gateway_event(change))
            last = change.version
            continue
        if change.type == changes.ChangeType.SSH_REVOKED:
            await send(_revoked_event(change))
            last = change.version
            continue
        if change.scope == changes.Scope.ALL_NODES and config is not None:
            config = await nodes.with_gateways_at(ctx, config, change.version)
            kind = "gateway_changed"
        else:
            try:
                config = await nodes.config(ctx, sub.ident)
            except problems.Problem:  # deleted meanwhile: the 'deleted' change follows
                continue
            kind = "gateway_changed" if change.scope == changes.Scope.ALL_NODES else "config"
        version = max(change.version, config.version)
        await send(WatchEvent(type=kind, version=version, config=config))
        last = version


async def _presence(ctx, gateway_id: str) -> None:
    """Until cancelled (the stream ended): the gateway is seen every :func:`gateways.touch_interval` s."""
    while True:
        await asyncio.sleep(gateways.touch_interval(ctx.settings))
        try:
            await gateways.touch(ctx, gateway_id)
        except Exception as err:  # the database hiccuped: the next touch will do
            log.warning("recording that gateway %s is still there failed: %s", gateway_id, err)


async def _drain(ws: web.WebSocketResponse) -> None:
    """Read (and ignore) client frames so pings, pongs and close are handled."""
    async for msg in ws:
        if msg.type == WSMsgType.ERROR:
            return


async def _close(request: web.Request, ws: web.WebSocketResponse, code: int, message: bytes) -> None:
    """Close with ``code``; drop the connection when the watcher does not take the close frame."""
    try:
        async with asyncio.timeout(CLOSE_TIMEOUT):
            await ws.close(code=code, message=message)
    except TimeoutError:
        if request.transport is not None:
            request.transport.abort()


async def watch(call: Call) -> web.StreamResponse:
    ctx, principal, request = call.ctx, call.principal, call.request
    since = _since(request)
    ws = web.WebSocketResponse(heartbeat=WS_HEARTBEAT)
    if not ws.can_prepare(request).ok:
        raise problems.bad_request("this route needs a WebSocket upgrade (GET with Upgrade: websocket)")
    sub = ctx.feed.subscribe(principal.kind, principal.id)
    ctx.websockets.add(ws)
    ctx.metrics.watchers.inc()
    try:
        await ws.prepare(request)
        config = None
        try:
            if principal.kind == "gateway":
                last = await _gateway_start(ctx, ws, principal.id, since)
            else:
                last, config = await _node_start(ctx, ws, principal.id, since)
        except problems.Problem:  # deleted by another coordinator; our feed has not said so yet
            ctx.auth.forget(principal.id)
            await ws.close(code=CLOSE_REVOKED, message=b"credential revoked")
            return ws
        credential_hash = credentials.hash_secret(bearer(request) or "")
        pump = asyncio.create_task(
            _pump(ctx, ws, sub, last, credential_hash, config, ctx.settings.limits.watch_send_timeout),
            name=f"watch-pump-{principal.id}",
        )
        drain = asyncio.create_task(_drain(ws), name=f"watch-drain-{principal.id}")
        helpers = [pump, drain]
        if principal.kind == "gateway":  # an open stream is the gateway's sign of life
            helpers.append(asyncio.create_task(_presence(ctx, principal.id), name=f"watch-presence-{principal.id}"))
        try:
            await asyncio.wait({pump, drain}, return_when=asyncio.FIRST_COMPLETED)
            if pump.done() and not pump.cancelled() and pump.exception() is None and not ws.closed:
                # revoked: stop the reader first, so close() is the only reader and completes
                # the closing handshake (a close beside a pending receive() drops the TCP
                # connection at once, and the client may see 1006 instead of our code)
                drain.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await drain
                code = pump.result()
                message = b"credential revoked" if code == CLOSE_REVOKED else b"changes were missed: resume for a snapshot"
                if sub.overflowed:
                    ctx.metrics.watch_resyncs.inc()
                await _close(request, ws, code, message)
        finally:
            for task in helpers:
                task.cancel()
            for task in helpers:
                with contextlib.suppress(asyncio.CancelledError, ConnectionError, RuntimeError):
                    await task
    except (ConnectionError, RuntimeError) as err:  # the client went away mid-send
        log.debug("watch of %s %s ended: %s", principal.kind, principal.id, err)
    finally:
        ctx.feed.unsubscribe(sub)
        ctx.websockets.discard(ws)
        ctx.metrics.watchers.dec()
    return ws


def setup(registry: RouteRegistry, ctx) -> None:
    registry.add(Route(
        "GET", "/v1/watch", watch, Auth.node_or_gateway,
        "WebSocket stream of peer changes (gateways) or config changes (nodes); resumes from ?since",
        response_model=WatchEvent, websocket=True, tags=("watch",), problems=(400, 422),
        query=(QueryParam("since", "integer", "last version the client has; 0 for a snapshot"),),
    ))
