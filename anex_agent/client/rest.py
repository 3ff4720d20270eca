"""Async client of the coordinator's REST API, used by the agent, the gateway and tools.

Contract:
* Every method returns the wire model of the response (:mod:`anex_agent.wire`) or
  raises :class:`~anex_agent.errors.CoordinatorError` with ``status`` (None when no
  response came back), ``retryable`` (True for connection errors, timeouts, 5xx and
  429) and ``problem`` (the RFC 9457 document the coordinator sent). A response that
  does not parse as the expected model is a non-retryable CoordinatorError.
* ``credential`` authenticates node/gateway calls, ``admin_token`` admin calls; a call
  uses whichever the route needs (:meth:`set_credential` after joining). A heartbeat
  answer or a gateway renewal carrying a rotated credential replaces it here too.
* :meth:`join` and :meth:`register_gateway` take the caller's :class:`~anex_agent.wire.keys.KeyPair`
  and prove its possession (:mod:`anex_agent.wire.proof`) against the coordinator's key, read
  once from ``GET /v1/coordinator``; ``clock`` gives the proof's timestamp.
* :meth:`watch` yields :class:`~anex_agent.wire.watch.WatchEvent` forever: it reconnects with jittered
  exponential backoff and resumes from the last version it yielded (after a snapshot:
  the snapshot's version, even when lower than before). It raises (does
  not retry) a non-retryable error, e.g. a revoked credential (401).
* Use as ``async with CoordinatorClient(url, ...) as client:`` (or call :meth:`close`).
* An ``https://`` coordinator's certificate is verified against the system CA store plus
  ``ca_file`` (:func:`anex_agent.client.transport.client_ssl_context`), for REST calls and the
  watch WebSocket alike.
* Transport: REST calls go over :class:`anex_agent.net.http.client.HttpClient` (HTTP/1.1 on h11,
  kept-alive connections, ``proxy`` through CONNECT for ``https://``); ``timeout`` bounds each
  whole call; an answer larger than ``max_response_bytes`` is a non-retryable error. The watch
  stream is a WebSocket of the ``websockets`` library (ping every 20 s; the same headers, TLS
  context and proxy); close code 4001 means the credential was revoked.
  :meth:`node_logs` streams (only the connect and the answer's head are timed).
* :meth:`watch_provisions` (admin) yields :class:`provision_wire.ProvisionEvent` forever the same
  way: each (re)connection starts with a ``snapshot`` of every provision.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from anex_agent.wire import keys, proof, provisioning as provision_wire
from anex_agent.wire.base import Provider
from anex_agent.wire.gateways import (
    CredentialRenewal, GatewayList, GatewayRegisterRequest, GatewayRegisterResponse, GatewayView, PeerSet,
)
from anex_agent.wire.heartbeat import Heartbeat, HeartbeatAck
from anex_agent.wire.join import CoordinatorInfo, JoinTokenCreate, JoinTokenCreated, JoinTokenList, KeyProof, TokenKind
from anex_agent.wire.nodes import (
    AgentAccessToken, NodeConfig, NodeFacts, NodeJoinRequest, NodeJoinResponse, NodeList, NodeTelemetry, NodeView,
    TunnelSpec, TunnelsUpdate,
)
from anex_agent.wire.reader import read
from anex_agent.wire.watch import WatchEvent

if TYPE_CHECKING:
    from anex_agent.wire import ssh as ssh_wire


def _ssh_wire():
    """The remote-access models, imported at the first SSH call (most processes never make one)."""
    from anex_agent.wire import ssh as ssh_wire

    return ssh_wire
from anex_agent.backoff import Backoff
from anex_agent.errors import CoordinatorError
from anex_agent.net.http.client import DEFAULT_MAX_BODY, HttpClient, HttpError, with_query

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

DEFAULT_TIMEOUT = 10.0
WATCH_BACKOFF_INITIAL = 0.5
# The cap bounds how long a gateway or agent stays blind after the coordinator comes back;
# the jitter (anex_agent.backoff's) spreads a fleet's reconnects.
WATCH_BACKOFF_MAX = 10.0
CLOSE_REVOKED = 4001  # the coordinator's close code for a revoked credential
WATCH_PING_INTERVAL = 20.0  # seconds between pings on the watch stream (a dead one is noticed)
WATCH_CLOSE_TIMEOUT = 5.0
LOGS_CONNECT_TIMEOUT = 10.0


def _retryable_status(status: int) -> bool:
    return status >= 500 or status == 429


class CoordinatorClient:
    def __init__(
        self,
        base_url: str,
        credential: str | None = None,
        admin_token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        session: HttpClient | None = None,
        ca_file: Path | None = None,
        clock: Callable[[], float] = time.time,
        proxy: str | None = None,
        max_response_bytes: int = DEFAULT_MAX_BODY,
    ) -> None:
        """``session``: an :class:`HttpClient` to share (not closed by :meth:`close`); None: one of
        our own, built on the first call."""
        self.base_url = base_url.rstrip("/")
        self.ca_file = ca_file
        self.proxy = proxy  # http://HOST:PORT of an egress proxy (CONNECT for https), or None
        self.credential = credential
        self.admin_token = admin_token
        self.coordinator_key: bytes | None = None  # X25519 public key, from GET /v1/coordinator
        self.watch_connected = False  # a watch stream is open now (metrics, status)
        self._clock = clock
        self._timeout = timeout
        self._max_response_bytes = max_response_bytes
        self._session = session
        self._own_session = session is None

    async def __aenter__(self) -> CoordinatorClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None and self._own_session:
            await self._session.close()
            self._session = None

    def set_credential(self, credential: str) -> None:
        self.credential = credential

    def _ssl_context(self):
        from anex_agent.client.transport import client_ssl_context

        return client_ssl_context(self.ca_file)

    def _get_session(self) -> HttpClient:
        if self._session is None:
            self._session = HttpClient(ssl_context=self._ssl_context, proxy=self.proxy, timeout=self._timeout,
                                       max_body=self._max_response_bytes)
            self._own_session = True
        return self._session

    def _headers(self, auth: str | None) -> dict[str, str]:
        secret = {"admin": self.admin_token, "credential": self.credential, None: None}[auth]
        if auth is not None and not secret:
            raise CoordinatorError(f"no {auth} configured for this call", retryable=False)
        return {"Authorization": f"Bearer {secret}"} if secret else {}

    async def _call(
        self,
        method: str,
        path: str,
        model: type[M] | None,
        *,
        auth: str | None,
        body: BaseModel | None = None,
    ) -> M | None:
        data = body.model_dump_json(exclude_unset=False).encode() if body is not None else None
        status, raw = await self._send(method, path, data, auth)
        if model is None:
            return None
        try:
            return read(model, raw)  # fields a newer coordinator added: ignored
        except ValidationError as err:
            raise CoordinatorError(f"{method} {path}: unexpected response: {err}", status=status) from None

    async def call_json(self, method: str, path: str, *, body: Any = None, auth: str | None = "admin") -> Any:
        """One call with a JSON ``body`` (any JSON value, or None for none); the answer's JSON, or
        None for an empty answer (204). For tools that show what the coordinator answered as it
        is (``anex-agent admin``); errors as every other call."""
        data = json.dumps(body).encode() if body is not None else None
        status, raw = await self._send(method, path, data, auth)
        if not raw:
            return None
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise CoordinatorError(f"{method} {path}: the answer is not JSON", status=status) from None

    async def _send(self, method: str, path: str, data: bytes | None, auth: str | None) -> tuple[int, bytes]:
        """``(status, body)`` of a 1xx-3xx answer; CoordinatorError for a 4xx/5xx or no answer."""
        url = self.base_url + path
        headers = self._headers(auth)
        if data is not None:
            headers["Content-Type"] = "application/json"
        session = self._get_session()
        try:
            status, answer_headers, raw = await session.request(method, url, body=data, headers=headers,
                                                                 timeout=self._timeout)
        except TimeoutError:
            raise CoordinatorError(f"{method} {path}: timed out", retryable=True) from None
        except HttpError as err:
            raise CoordinatorError(f"{method} {path}: {err}", retryable=not _too_large(err)) from None
        if is_html(answer_headers, raw):  # a web server or proxy, not the coordinator: its page says nothing to us
            raise CoordinatorError(f"URL {self.base_url} answered {status} with HTML to {method} {path}: "
                                   "is it the coordinator's URL?",
                                   status=status, retryable=_retryable_status(status))
        if status >= 400:
            problem = _problem(raw)
            detail = problem.get("detail") or problem.get("title") or _text_excerpt(raw)
            raise CoordinatorError(
                f"{method} {path}: {status} {detail}", status=status, retryable=_retryable_status(status), problem=problem
            )
        return status, raw

    # ------------------------------------------------------------ proofs

    async def coordinator_info(self) -> CoordinatorInfo:
        return await self._call("GET", "/v1/coordinator", CoordinatorInfo, auth=None)

    async def _coordinator_key(self) -> bytes:
        if self.coordinator_key is None:
            info = await self.coordinator_info()
            self.coordinator_key = keys.decode_key(info.public_key, what="the coordinator's public key")
        return self.coordinator_key

    async def _prove(self, request: M, purpose: str, key: keys.KeyPair) -> M:
        """``request`` with its ``proof`` of possession of ``key`` (made now). The digest covers every
        field, as :meth:`_call` sends every field (defaults included)."""
        made = proof.make(
            purpose, private_key=key.private, public_key=key.public_b64, coordinator_key=await self._coordinator_key(),
            fields=request.model_dump(mode="json", exclude={"proof"}), now=self._clock(),
        )
        return request.model_copy(update={"proof": KeyProof(**made)})

    async def _post_proven(self, path: str, model: type[M], request: BaseModel) -> M:
        try:
            return await self._call("POST", path, model, auth=None, body=request)
        except CoordinatorError as err:
            if err.status == 401:  # the coordinator's key may have changed: read it again next time
                self.coordinator_key = None
            raise

    # ------------------------------------------------------------ nodes

    async def join(
        self,
        token: str,
        key: keys.KeyPair,
        name: str,
        provider: Provider | str,
        facts: NodeFacts | None = None,
    ) -> NodeJoinResponse:
        """Join with a join token, proving possession of ``key``; remembers the returned credential."""
        request = NodeJoinRequest(
            token=token, public_key=key.public_b64, name=name, provider=provider, facts=facts or NodeFacts()
        )
        request = await self._prove(request, proof.NODE_JOIN, key)
        response = await self._post_proven("/v1/nodes", NodeJoinResponse, request)
        self.credential = response.credential
        return response

    async def get_config(self, node_id: str) -> NodeConfig:
        auth = "credential" if self.credential else "admin"
        return await self._call("GET", f"/v1/nodes/{node_id}/config", NodeConfig, auth=auth)

    async def heartbeat(self, node_id: str, heartbeat: Heartbeat) -> HeartbeatAck:
        """Send a heartbeat; an answer with a rotated credential replaces ours (the caller persists it)."""
        ack = await self._call(
            "POST", f"/v1/nodes/{node_id}/heartbeat", HeartbeatAck, auth="credential", body=heartbeat
        )
        if ack.credential:
            self.credential = ack.credential
        return ack

    async def get_telemetry(self, node_id: str) -> NodeTelemetry:
        auth = "credential" if self.credential else "admin"
        return await self._call("GET", f"/v1/nodes/{node_id}/telemetry", NodeTelemetry, auth=auth)

    # ------------------------------------------------------------ gateways

    async def register_gateway(
        self,
        token: str,
        key: keys.KeyPair,
        name: str,
        *,
        endpoint: str | None = None,
        ws_url: str | None = None,
        routes: list[str] | None = None,
    ) -> GatewayRegisterResponse:
        """Register a gateway, proving possession of ``key``; remembers the returned credential."""
        request = GatewayRegisterRequest(
            token=token, public_key=key.public_b64, name=name, endpoint=endpoint, ws_url=ws_url, routes=routes or []
        )
        request = await self._prove(request, proof.GATEWAY_REGISTRATION, key)
        response = await self._post_proven("/v1/gateways", GatewayRegisterResponse, request)
        self.credential = response.credential
        return response

    async def get_peers(self, gateway_id: str) -> PeerSet:
        return await self._call("GET", f"/v1/gateways/{gateway_id}/peers", PeerSet, auth="credential")

    async def gateway_gone(self, gateway_id: str, *, auth: str | None = "credential") -> GatewayView:
        """Mark the gateway gone (it stops): nodes leave it out until it is back. ``auth``:
        ``credential`` (the gateway itself) or ``admin``."""
        return await self._call("POST", f"/v1/gateways/{gateway_id}/gone", GatewayView, auth=auth)

    async def renew_gateway_credential(self, gateway_id: str) -> CredentialRenewal:
        """Rotate the gateway's credential; remembers the new one (the caller persists it)."""
        renewal = await self._call(
            "POST", f"/v1/gateways/{gateway_id}/credential", CredentialRenewal, auth="credential"
        )
        self.credential = renewal.credential
        return renewal

    # ------------------------------------------------------------ admin

    async def create_join_token(
        self,
        kind: TokenKind | str = TokenKind.node,
        *,
        reusable: bool = False,
        expires_in: int = 3600,
        labels: dict[str, str] | None = None,
        max_uses: int | None = None,
        providers: list[Provider | str] | None = None,
    ) -> JoinTokenCreated:
        """``max_uses`` None: 1, or no limit with ``reusable``; ``providers`` None: any (node tokens)."""
        request = JoinTokenCreate(
            kind=kind, reusable=reusable, expires_in=expires_in, labels=labels or {}, max_uses=max_uses,
            providers=providers,
        )
        return await self._call("POST", "/v1/join-tokens", JoinTokenCreated, auth="admin", body=request)

    async def list_join_tokens(self) -> JoinTokenList:
        return await self._call("GET", "/v1/join-tokens", JoinTokenList, auth="admin")

    async def revoke_join_token(self, token_id: str) -> None:
        await self._call("DELETE", f"/v1/join-tokens/{token_id}", None, auth="admin")

    async def list_nodes(self) -> NodeList:
        return await self._call("GET", "/v1/nodes", NodeList, auth="admin")

    async def get_node(self, node_id: str) -> NodeView:
        return await self._call("GET", f"/v1/nodes/{node_id}", NodeView, auth="admin")

    async def delete_node(self, node_id: str) -> None:
        await self._call("DELETE", f"/v1/nodes/{node_id}", None, auth="admin")

    async def put_tunnels(self, node_id: str, tunnels: list[TunnelSpec]) -> NodeConfig:
        return await self._call(
            "PUT", f"/v1/nodes/{node_id}/tunnels", NodeConfig, auth="admin", body=TunnelsUpdate(tunnels=tunnels)
        )

    async def create_access_token(self, node_id: str) -> AgentAccessToken:
        return await self._call("POST", f"/v1/nodes/{node_id}/access-token", AgentAccessToken, auth="admin")

    async def node_logs(self, node_id: str, *, direct: bool = False, **params: str | int) -> AsyncIterator[bytes]:
        """The node's workload logs, chunk by chunk as they come (``follow``, ``tail``, ``since``,
        ``stream``, ``timestamps`` as the agent's ``GET /logs`` takes them).

        Through the coordinator (``GET /v1/nodes/{id}/logs``), or with ``direct`` straight from
        the agent API at the node's mesh address with a fresh access token: for a caller that
        reaches the mesh when the coordinator does not. CoordinatorError on a refusal."""
        query = {name: str(value) for name, value in params.items()}
        if direct:
            view = await self.get_node(node_id)
            token = (await self.create_access_token(node_id)).token
            host = f"[{view.address}]" if ":" in view.address else view.address
            url, headers = f"http://{host}:{view.facts.api_port}/logs", {"Authorization": f"Bearer {token}"}
        else:
            url, headers = f"{self.base_url}/v1/nodes/{node_id}/logs", self._headers("admin")
        try:
            async with self._get_session().stream("GET", with_query(url, query), headers=headers,
                                                  connect_timeout=LOGS_CONNECT_TIMEOUT) as resp:
                if resp.status >= 400:
                    problem = _problem(await resp.read())
                    raise CoordinatorError(f"GET {url}: {resp.status} {problem.get('detail') or ''}".rstrip(),
                                           status=resp.status, retryable=_retryable_status(resp.status),
                                           problem=problem)
                async for chunk in resp.chunks():
                    yield chunk
        except TimeoutError:
            raise CoordinatorError(f"GET {url}: timed out connecting", retryable=True) from None
        except HttpError as err:
            raise CoordinatorError(f"GET {url}: {err}", retryable=True) from None

    async def push_file(self, node_id: str, path: str, data: bytes, mode: int) -> None:
        """``PUT /v1/nodes/{id}/files``: ``data`` written atomically at ``path`` (inside the node's push
        directories) with ``mode``; passed through the coordinator, never stored there."""
        query = with_query(f"/v1/nodes/{node_id}/files", {"path": path, "mode": f"{mode:04o}"})
        await self._send("PUT", query, data, "admin")

    # ------------------------------------------------------------ provisions (admin)

    async def create_provision(self, spec: provision_wire.ProvisionCreate) -> provision_wire.ProvisionView:
        """``POST /v1/provisions``: idempotent by ``spec.name`` (the same body again answers the
        existing provision; another body under the name is a 409 CoordinatorError)."""
        return await self._call("POST", "/v1/provisions", provision_wire.ProvisionView, auth="admin", body=spec)

    async def list_provisions(self) -> provision_wire.ProvisionList:
        return await self._call("GET", "/v1/provisions", provision_wire.ProvisionList, auth="admin")

    async def get_provision(self, provision_id: str) -> provision_wire.ProvisionView:
        return await self._call("GET", f"/v1/provisions/{provision_id}", provision_wire.ProvisionView, auth="admin")

    async def delete_provision(self, provision_id: str) -> provision_wire.ProvisionView:
        """``DELETE /v1/provisions/{id}``: idempotent; the rental is destroyed, then the node removed."""
        return await self._call("DELETE", f"/v1/provisions/{provision_id}", provision_wire.ProvisionView,
                                auth="admin")

    async def list_offers(self, providers: list[str], limit: int = 100) -> dict[str, Any]:
        """``GET /v1/offers`` (admin): every normalized offer of ``providers``, cheapest first, as the
        JSON document (``offers[].specs`` in annotation units, docs/selection.md)."""
        query = with_query("/v1/offers", {"provider": ",".join(providers), "limit": str(limit)})
        _, raw = await self._send("GET", query, None, "admin")
        doc = _problem(raw)  # a JSON object, or {}
        if not isinstance(doc.get("offers"), list):
            raise CoordinatorError(f"GET {query}: unexpected response: no offers list")
        return doc

    async def list_gateways(self) -> GatewayList:
        return await self._call("GET", "/v1/gateways", GatewayList, auth="admin")

    async def delete_gateway(self, gateway_id: str) -> None:
        await self._call("DELETE", f"/v1/gateways/{gateway_id}", None, auth="admin")

    # ------------------------------------------------------------ watch

    # ------------------------------------------------------------ remote access (anex_agent.wire.ssh)

    async def ssh_ca(self) -> ssh_wire.SshCa:
        return await self._call("GET", "/v1/ssh/ca", _ssh_wire().SshCa, auth=None)

    async def create_ssh_certificate(self, node_id: str, request: ssh_wire.SshCertificateRequest) -> ssh_wire.SshCertificate:
        return await self._call("POST", f"/v1/nodes/{node_id}/ssh-certificates", _ssh_wire().SshCertificate,
                                auth="admin", body=request)

    async def list_ssh_certificates(self, node_id: str | None = None) -> ssh_wire.SshCertificateList:
        query = f"?node_id={node_id}" if node_id else ""
        return await self._call("GET", f"/v1/ssh/certificates{query}", _ssh_wire().SshCertificateList, auth="admin")

    async def revoke_ssh_certificate(self, serial: int) -> ssh_wire.SshCertificateRecord:
        return await self._call("POST", f"/v1/ssh/certificates/{serial}/revoke", _ssh_wire().SshCertificateRecord,
                                auth="admin")

    async def ssh_host_certificate(self, node_id: str, public_key: str) -> ssh_wire.SshHostCertificate:
        return await self._call("POST", f"/v1/nodes/{node_id}/ssh-host-certificate", _ssh_wire().SshHostCertificate,
                                auth="credential", body=_ssh_wire().SshHostCertificateRequest(public_key=public_key))

    async def ssh_revocations(self, node_id: str) -> ssh_wire.SshRevocations:
        auth = "credential" if self.credential else "admin"
        return await self._call("GET", f"/v1/nodes/{node_id}/ssh-revocations", _ssh_wire().SshRevocations, auth=auth)

    async def report_ssh_sessions(self, node_id: str, sessions: list[ssh_wire.SshSession]) -> None:
        await self._call("POST", f"/v1/nodes/{node_id}/ssh-sessions", None, auth="credential",
                         body=_ssh_wire().SshSessionReport(sessions=sessions))

    async def list_ssh_sessions(self, node_id: str | None = None) -> ssh_wire.SshSessionList:
        query = f"?node_id={node_id}" if node_id else ""
        return await self._call("GET", f"/v1/ssh/sessions{query}", _ssh_wire().SshSessionList, auth="admin")

    async def watch(self, since: int = 0) -> AsyncIterator[WatchEvent]:
        """Yield watch events forever, reconnecting and resuming from the last version seen."""
        backoff = Backoff(base=WATCH_BACKOFF_INITIAL, cap=WATCH_BACKOFF_MAX)
        version = since
        while True:
            connected: list[bool] = []
            try:
                async with contextlib.aclosing(self._watch_once(f"/v1/watch?since={version}", WatchEvent, "credential",
                                                                connected)) as stream:  # closed when we end
                    async for event in stream:
                        # a snapshot is the whole state as of its version, also when that version is
                        # lower than ours (the coordinator's change log started over): resume from it
                        version = event.version if event.type == "snapshot" else max(version, event.version)
                        backoff.reset()
                        yield event
                err: CoordinatorError | None = CoordinatorError("watch stream closed by the coordinator", retryable=True)
            except CoordinatorError as exc:
                if not exc.retryable:
                    raise
                err = exc
            if connected:  # the stream was up: this is a fresh outage, start the backoff over
                backoff.reset()
            delay = backoff.next_delay()
            log.info("watch: %s; reconnecting in %.1fs from version %d", err, delay, version)
            await asyncio.sleep(delay)

    async def watch_provisions(self) -> AsyncIterator[provision_wire.ProvisionEvent]:
        """Yield ``/v1/provisions/watch`` events forever (admin), reconnecting with jittered backoff;
        every connection starts with a ``snapshot``. Raises a non-retryable error (401, 403)."""
        backoff = Backoff(base=WATCH_BACKOFF_INITIAL, cap=WATCH_BACKOFF_MAX)
        while True:
            connected: list[bool] = []
            try:
                async with contextlib.aclosing(self._watch_once("/v1/provisions/watch", provision_wire.ProvisionEvent,
                                                                "admin", connected)) as stream:  # closed when we end
                    async for event in stream:
                        backoff.reset()
                        yield event
                err = CoordinatorError("provisions watch stream closed by the coordinator", retryable=True)
            except CoordinatorError as exc:
                if not exc.retryable:
                    raise
                err = exc
            if connected:
                backoff.reset()
            delay = backoff.next_delay()
            log.info("provisions watch: %s; reconnecting in %.1fs", err, delay)
            await asyncio.sleep(delay)

    async def _watch_once(self, path: str, model: type[M], auth: str,
                          connected: list[bool]) -> AsyncIterator[M]:
        """One stream of ``model`` events from ``path``; appends True to ``connected`` once the
        WebSocket handshake succeeded."""
        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

        url = "ws" + self.base_url.removeprefix("http") + path
        headers = self._headers(auth)
        kwargs: dict[str, Any] = {"ssl": self._ssl_context()} if url.startswith("wss://") else {}
        try:
            ws = await connect(
                url, additional_headers=headers, proxy=self.proxy, open_timeout=self._timeout,
                ping_interval=WATCH_PING_INTERVAL, ping_timeout=WATCH_PING_INTERVAL, close_timeout=WATCH_CLOSE_TIMEOUT,
                max_size=self._max_response_bytes, compression=None, user_agent_header="anex-agent", **kwargs,
            )
        except InvalidStatus as err:
            status = err.response.status_code
            raise CoordinatorError(
                f"watch: {status} {err.response.reason_phrase}", status=status, retryable=_retryable_status(status),
                problem=_problem(err.response.body or b""),
            ) from None
        except TimeoutError:
            raise CoordinatorError("watch: timed out connecting", retryable=True) from None
        except (WebSocketException, OSError) as err:
            raise CoordinatorError(f"watch: {err}", retryable=True) from None
        connected.append(True)
        self.watch_connected = True
        try:
            try:
                async for message in ws:
                    if isinstance(message, str):
                        try:
                            yield read(model, message)
                        except ValidationError as err:
                            raise CoordinatorError(f"watch: unexpected event: {err}") from None
            except ConnectionClosed:
                pass  # why it closed: the close code below
            except OSError as err:  # the connection lost while receiving: the caller reconnects
                raise CoordinatorError(f"watch: connection lost: {err}", retryable=True) from None
            if ws.close_code == CLOSE_REVOKED:
                raise CoordinatorError("watch: credential revoked", status=401, retryable=False)
        finally:
            self.watch_connected = False
            try:  # bounded: websockets' close waits for the send buffer to drain, unbounded
                async with asyncio.timeout(WATCH_CLOSE_TIMEOUT):
                    await ws.close()
            except (OSError, WebSocketException, TimeoutError):  # a connection already lost, or one that does not answer
                _drop(ws)
            except asyncio.CancelledError:  # cancelled again while closing: drop the connection, end now
                _drop(ws)
                raise


def _drop(ws: Any) -> None:
    """Close a WebSocket's connection at once, without the closing handshake."""
    transport = getattr(ws, "transport", None)
    if transport is not None:
        transport.abort()


def proven_body(
    model: type[NodeJoinRequest] | type[GatewayRegisterRequest], body: dict[str, Any], key: keys.KeyPair,
    coordinator_key: str, *, now: float | None = None,
) -> dict[str, Any]:
    """``body`` (a join or registration request as a dict) with its ``proof``, for callers that speak
    raw HTTP (tools, tests). ``coordinator_key`` is ``GET /v1/coordinator``'s ``public_key``."""
    request = model.model_validate({**body, "public_key": key.public_b64})
    purpose = proof.NODE_JOIN if model is NodeJoinRequest else proof.GATEWAY_REGISTRATION
    made = proof.make(
        purpose, private_key=key.private, public_key=key.public_b64,
        coordinator_key=keys.decode_key(coordinator_key, what="the coordinator's public key"),
        fields=request.model_dump(mode="json", exclude={"proof"}, exclude_unset=True),
        now=time.time() if now is None else now,
    )
    return {**body, "public_key": key.public_b64, "proof": made}


def _too_large(err: HttpError) -> bool:
    from anex_agent.net.http.client import BodyTooLarge

    return isinstance(err, BodyTooLarge)


def is_html(headers: dict[str, str], raw: bytes) -> bool:
    """Whether an answer is a web page (``Content-Type: text/html``, or a body that opens like
    one): what a web server, proxy or ingress in front of the wrong URL sends, never the
    coordinator (JSON, problem+json)."""
    kind = headers.get("content-type", "").split(";")[0].strip().lower()
    if kind in ("text/html", "application/xhtml+xml"):
        return True
    start = raw[:64].lstrip().lower()
    return start.startswith((b"<!doctype html", b"<html"))


def _text_excerpt(raw: bytes, limit: int = 120) -> str:
    """The first line of a non-problem answer, printable and short (it may be any server's)."""
    line = raw[:limit * 4].decode("utf-8", "replace").strip().split("\n", 1)[0]
    line = "".join(c if c.isprintable() else "?" for c in line)
    return line[:limit] + ("..." if len(line) > limit else "")


def _problem(raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}
