"""The gateway supervisor: register, run the hub, follow the watch stream, route and serve DNS.

Start order (teardown runs in reverse, also after errors):

1. key pair from the state dir (``private.key``, 0600; only the public key leaves);
2. register with the coordinator (``POST /v1/gateways``; the same key gives the same
   gateway) while the WireGuard engine (kernel or wireguard-go) starts beside it. If the
   coordinator cannot be reached and a previous registration is saved in the state dir,
   start from it (fail static) and keep trying in the background;
3. the hub configured with the received/saved peers; then a thread writes that set whole
   to the state dir while the next steps run (the watch loop waits for it);
4. IP forwarding on (restored on exit if we changed it) and our nftables table;
5. the WebSocket relay (``--ws-listen``), the metrics (``--metrics-listen``,
   :mod:`anex_agent.gateway.metrics`) and the DNS forwarder on the mesh address
   (``--dns-upstream``), each when set;
6. the watch loop: events are applied to the hub as they come, each as a change of the
   peers it names only (:meth:`Engine.update_peers`: one small UAPI/netlink write, the
   other peers neither read nor rewritten); a snapshot (first connect, or a gap the
   coordinator cannot replay) is diffed against the device itself, so the hub converges
   to exactly the coordinator's set. Each change is journaled in the state dir (one line,
   written in a thread at most every :data:`SAVE_INTERVAL` seconds; the whole set is
   rewritten only now and then: :mod:`anex_agent.gateway.state`). On disconnect it reconnects with
   jittered backoff, asking for ``since=<version>``, and keeps the last peers meanwhile
   (fail static). A refused credential (401) makes it register again (token and key
   proof); when that is refused too it says so and stops;
7. the credential renewal: every ``credential_rotation`` seconds (from the registration
   answer) ``POST /v1/gateways/{id}/credential``; the new credential is saved at once.

Every task is named and owned by one TaskGroup; SIGTERM/SIGINT end it cleanly: the watch
stream closes and the gateway tells the coordinator it is gone (``POST
/v1/gateways/{id}/gone``, at most :data:`LEAVE_TIMEOUT` s: an unreachable coordinator does
not hold the stop up; it then finds the gateway silent after its ``--gateway-gone-after``),
so nodes leave it out of their configs until it is back (its next watch stream).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import time
from contextlib import AsyncExitStack

from anex_agent.client import join_token
from anex_agent.wire import keys
from anex_agent.backoff import Backoff
from anex_agent.errors import AnexError, ConfigError, CoordinatorError, EngineError
from anex_agent.gateway import forwarding, nft
from anex_agent.gateway.link import GatewayLink
from anex_agent.gateway.metrics import GatewayMetrics
from anex_agent.gateway.peers import PeerBook, PeerDelta
from anex_agent.gateway.settings import GatewaySettings, interface_for, table_for
from anex_agent.gateway.state import GatewayState, Registration
from anex_agent.tasks import Tasks
from anex_agent.tunnels.engines.base import Engine
from anex_agent.tunnels.engines.config import DesiredConfig
from anex_agent.tunnels.engines.registry import choose_engine
from anex_agent.wire.gateways import GatewayRegisterRequest, GatewayRegisterResponse, PeerSet
from anex_agent.wire.watch import WatchEvent

log = logging.getLogger(__name__)

#: Seconds between two writes of the journal while the peer set changes: short, because a
#: gateway restarted while the coordinator is down starts from what was written (changes
#: within the last interval come back only when the coordinator does); long enough that a
#: burst of changes is one write.
SAVE_INTERVAL = 0.1
#: Seconds a stop waits for the coordinator to take the gateway's "gone" (it is bounded: a stop never hangs).
LEAVE_TIMEOUT = 3.0


class _Stop(Exception):
    """Raised inside the TaskGroup to end the gateway cleanly."""


def _first_anex_error(group: BaseExceptionGroup) -> AnexError | None:
    """The first of our own errors inside a (nested) exception group, so the CLI prints one line."""
    for exc in group.exceptions:
        if isinstance(exc, AnexError):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            found = _first_anex_error(exc)
            if found is not None:
                return found
    return None


class Gateway:
    """One gateway process. ``await Gateway(settings).run()`` until SIGTERM/SIGINT or :meth:`stop`."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.state = GatewayState(settings.state_dir)
        self.link = GatewayLink(settings.coordinator_url, ca_file=settings.ca_file)
        self.book = PeerBook()
        self.registration: Registration | None = None
        self.engine: Engine | None = None
        self.keypair: keys.KeyPair | None = None
        self.ifname = settings.interface
        self._stop = asyncio.Event()
        self._apply_lock = asyncio.Lock()
        self.ready = asyncio.Event()
        self.rotate_in = 3600.0  # seconds between credential renewals (the coordinator says)
        self.relay = None  # the WebSocket relay, when --ws-listen is set
        self._unsaved = asyncio.Event()  # changes recorded for the journal since the last write
        self.metrics = GatewayMetrics(self)  # served with --metrics-listen
        self._first_save: asyncio.Task | None = None  # the start's whole save (a thread)

    def stop(self) -> None:
        self._stop.set()

    # ------------------------------------------------------------ registration

    def _register_request(self) -> GatewayRegisterRequest:
        assert self.keypair is not None
        return GatewayRegisterRequest(
            token=self.settings.token, public_key=self.keypair.public_b64, name=self.settings.name,
            endpoint=self.settings.endpoint, ws_url=self.settings.ws_url, routes=list(self.settings.routes),
        )

    def _adopt(self, response: GatewayRegisterResponse) -> None:
        self.registration = Registration(
            coordinator_url=self.settings.coordinator_url, gateway_id=response.gateway_id,
            credential=response.credential, address=response.address, network=response.network, mtu=response.mtu,
        )
        self.rotate_in = response.credential_rotation
        self.link.set_credential(response.credential)

    async def _register_once(self) -> GatewayRegisterResponse:
        assert self.keypair is not None
        return await self.link.register(self._register_request(), self.keypair)

    async def _renew_loop(self) -> None:
        """Rotate our credential every ``rotate_in`` seconds and save it (the old one ends after a grace)."""
        delay = self.rotate_in
        while True:
            await asyncio.sleep(delay)
            assert self.registration is not None
            try:
                renewal = await self.link.renew(self.registration.gateway_id)
            except CoordinatorError as err:
                delay = min(self.rotate_in, 30.0)
                log.warning("renewing the gateway credential failed (%s); next try in %.0f s", err, delay)
                continue
            async with self._apply_lock:
                self.registration.credential = renewal.credential
                self.link.set_credential(renewal.credential)
                self.save_now()
            self.rotate_in = delay = renewal.rotate_in
            log.info("gateway credential rotated")

    async def _sleep_or_stop(self, delay: float) -> bool:
        """Sleep ``delay`` seconds; True when asked to stop meanwhile."""
        try:
            async with asyncio.timeout(delay):
                await self._stop.wait()
        except asyncio.TimeoutError:
            return False
        return True

    async def _initial_registration(self) -> bool | None:
        """Register, or fall back to the saved registration.

        Returns True when registered now, False when started from the saved state, None
        when asked to stop before either happened.
        """
        saved = self.state.load(self.settings.coordinator_url)
        backoff = Backoff(base=0.5, cap=15)
        while True:
            try:
                response = await self._register_once()
            except CoordinatorError as err:
                if saved is not None:
                    log.warning("cannot register now (%s); starting from the saved registration and peers", err)
                    self.registration, peer_set = saved
                    self.link.set_credential(self.registration.credential)
                    self.book = PeerBook.from_peer_set(peer_set)
                    return False
                if not err.retryable:
                    refused = join_token.refusal(self.settings.token_source, err, "gateway")
                    if refused is not None:  # one line naming where the token came from, why, what to do
                        raise refused from None
                    raise
                delay = backoff.next_delay()
                log.warning("cannot register with %s (%s); retrying in %.1f s", self.settings.coordinator_url, err, delay)
                if await self._sleep_or_stop(delay):
                    return None
                continue
            self._adopt(response)
            self.book = PeerBook.from_peer_set(response.peers)
            log.info("registered as gateway %s, mesh address %s, %d peers",
                     response.gateway_id, response.address, len(response.peers.peers))
            return True

    async def _register_later(self) -> None:
        """Background re-registration after a fail-static start (refreshes credential and peers)."""
        backoff = Backoff(base=1, cap=30)
        while True:
            await asyncio.sleep(backoff.next_delay())
            try:
                response = await self._register_once()
            except CoordinatorError as err:
                if not err.retryable:
                    log.error("registration refused: %s; going on with the saved registration (registering "
                              "again needs a new gateway token)", err)
                    return
                continue
            self._adopt(response)
            await self._apply_peers(PeerBook.from_peer_set(response.peers), replace=True)
            log.info("registered with the coordinator again")
            return

    # ------------------------------------------------------------ hub

    def desired(self) -> DesiredConfig:
        assert self.registration is not None and self.keypair is not None
        return DesiredConfig(
            private_key=self.keypair.private, listen_port=self.settings.listen_port,
            address=self.registration.interface_address, mtu=self.registration.mtu,
            peers=self.book.peer_configs(), routes=(),
        )

    async def _apply_peers(self, book: PeerBook | None = None, *, replace: bool = False, save: bool = True) -> None:
        """The whole config to the hub, diffed against the device (start, snapshot, re-registration).
        The whole set is saved first, so the state dir follows the book whatever the engine
        does (``save`` False: at start, where :meth:`_run` saves it after the apply)."""
        async with self._apply_lock:
            if book is not None and replace:
                self.book = book
            if save:
                self.save_now()
            assert self.engine is not None
            started = time.perf_counter()
            await self.engine.apply(self.desired())
            log.info("hub configured with %d peers in %.3f s", len(self.book.peers), time.perf_counter() - started)

    def _take(self, event: WatchEvent) -> PeerDelta:
        """Apply ``event`` to the peer book and queue it for the journal: the state dir follows
        the book, whatever the engine then makes of the change. A snapshot is saved whole
        (:meth:`_apply_peers`), not journaled."""
        delta = self.book.apply(event)
        if delta and event.type != "snapshot":
            self.state.record(event)
            self._unsaved.set()
        return delta

    async def _apply_delta(self, delta: PeerDelta) -> None:
        """Only the peers ``delta`` names to the hub; the whole config when the engine cannot."""
        assert self.engine is not None
        async with self._apply_lock:
            done = await self.engine.update_peers(delta.peer_configs(), delta.remove)
        if not done:
            await self._apply_peers()

    def save_now(self) -> None:
        """Save the registration and the whole peer set now (fail-static restarts start from it)."""
        self._unsaved.clear()
        if self.registration is not None:
            self.state.save(self.registration, self.book.to_peer_set())

    def _write_pending(self) -> None:
        """On the way out: the recorded changes to the journal (the whole set when there is none yet)."""
        if not self._unsaved.is_set():
            return
        self._unsaved.clear()
        if not self.state.flush() and not self.state.journal_id:
            self.save_now()

    async def _save_loop(self) -> None:
        """Write the recorded changes at most every :data:`SAVE_INTERVAL` s, in a thread: a
        journal line per change, the whole set only when the journal outgrew it (never on
        the loop that applies the events, never per event); also when the loop ends."""
        try:
            while True:
                await self._unsaved.wait()
                await asyncio.sleep(SAVE_INTERVAL)
                self._unsaved.clear()
                if self.registration is None:
                    continue
                if self.state.journal_id and not self.state.journal_full(len(self.book.peers)):
                    await asyncio.to_thread(self.state.flush)
                    continue
                registration = dataclasses.replace(self.registration)
                peers = PeerSet.model_construct(version=self.book.version, peers=list(self.book.peers.values()))
                if not await asyncio.to_thread(self.state.save, registration, peers, self.state.recorded):
                    self._unsaved.set()  # a flush wrote past this copy first: a fresher copy next time
        finally:
            self._write_pending()

    async def _watch_loop(self) -> None:
        """Follow the watch stream until stopped; pending changes are written on the way out."""
        if self._first_save is not None:
            await self._first_save  # a start's whole save comes before any journaled change
        try:
            await self._follow()
        finally:
            self._write_pending()

    async def _follow(self) -> None:
        backoff = Backoff(base=0.5, cap=15)
        while True:
            try:
                async for event in self.link.watch(self.book.version):
                    backoff.reset()
                    async with self._apply_lock:
                        delta = self._take(event)
                    if not delta:
                        continue
                    started = time.perf_counter()
                    try:
                        if event.type == "snapshot":
                            await self._apply_peers()  # a resync: converge on the device's actual peers
                        else:
                            await self._apply_delta(delta)
                    except EngineError as err:
                        self.metrics.apply_errors.inc()
                        log.error("could not apply peers after %s v%d: %s", event.type, event.version, err)
                    else:
                        self.metrics.apply_seconds.observe(time.perf_counter() - started)
                        self.metrics.changes.labels(event.type).inc()
                        log.info("%s v%d%s applied: %d peers", event.type, event.version,
                                 f" ({event.peer.name})" if event.peer is not None else "", len(self.book.peers))
            except CoordinatorError as err:
                if err.status in (401, 403):
                    if not self.settings.token:
                        log.error("the coordinator refused the gateway credential (%s) and no gateway token is set to "
                                  "register again; following the coordinator stops (keeping %d peers)",
                                  err, len(self.book.peers))
                        return
                    try:
                        self._adopt(await self._register_once())
                        self.save_now()
                        log.info("credential refreshed by registering again")
                    except CoordinatorError as reg_err:
                        if not reg_err.retryable:
                            log.error("the coordinator refused the gateway credential and registering again was "
                                      "refused too (%s); a new gateway token is needed; following the coordinator "
                                      "stops (keeping %d peers)", reg_err, len(self.book.peers))
                            return
                        log.warning("re-registration failed: %s", reg_err)
                log.warning("watch stream: %s (keeping %d peers)", err, len(self.book.peers))
            delay = backoff.next_delay()
            await asyncio.sleep(delay)

    # ------------------------------------------------------------ run

    async def run(self) -> int:
        """Run until stopped; the engine's tasks live in the gateway's TaskGroup (:mod:`anex_agent.tasks`)."""
        try:
            async with asyncio.TaskGroup() as tg:
                return await self._run(Tasks(tg, role="gateway"))
        except BaseExceptionGroup as group:
            error = _first_anex_error(group) or group.exceptions[0]
            raise error from None

    async def _run(self, tasks: Tasks) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.stop)
            except (NotImplementedError, RuntimeError):
                pass
        self.state.ensure()
        self.keypair = self.state.keypair()
        log.info("gateway public key %s", self.keypair.public_b64)
        async with AsyncExitStack() as stack:
            stack.push_async_callback(self.link.close)
            engine_cls, tried = choose_engine(self.settings.engine, source=self.settings.engine_source)
            log.info("engine: %s (%s)", engine_cls.name, tried[engine_cls.name].reason)
            self.ifname = self.ifname or interface_for(self.keypair.public_b64)
            self.engine = engine_cls(ifname=self.ifname)
            stack.push_async_callback(self.engine.stop)
            # the engine starts while the coordinator answers (it needs nothing from it); a
            # failure of either cancels the other, and the stack stops what was started
            async with asyncio.TaskGroup() as starting:
                registering = starting.create_task(self._initial_registration(), name="gateway-register")
                starting.create_task(self.engine.start(tasks), name="gateway-engine-start")
            registered = registering.result()
            if registered is None:
                return 0
            await self._apply_peers(save=False)
            # the whole set to the state dir (a registration's, or a clean journal after a start
            # from the state dir), by a thread while the rules go in and serving starts; the
            # watch loop applies no event before it is written
            assert self.registration is not None
            registration, peers = dataclasses.replace(self.registration), self.book.to_peer_set()
            self._first_save = tasks.spawn("gateway-first-save",
                                           lambda: asyncio.to_thread(self.state.save, registration, peers),
                                           on_failure="fail")
            previous = forwarding.enable()
            stack.callback(forwarding.restore, previous)
            table = table_for(self.ifname)
            stack.callback(nft.remove, table)
            nft.install(nft.GatewayRules(
                table=table, mesh_ifname=self.ifname, mesh_network=self.registration.network,
                mesh_address=self.registration.address, routes=self.settings.routes,
                dns=self.settings.dns_upstream is not None,
            ))
            try:
                await self._serve(stack, registered)
            except ExceptionGroup as group:
                raise _first_anex_error(group) or group from None
        return 0

    def is_peer(self, public_key: str) -> bool:
        """Whether ``public_key`` is a node of the hub's current peer set (the relay admits only those)."""
        return self.book.has_key(public_key)

    async def _start_relay(self, stack: AsyncExitStack) -> None:
        """The WebSocket relay (``--ws-listen``), towards the hub's UDP port on loopback."""
        if self.settings.ws_listen is None:
            return
        import ipaddress

        from anex_agent.gateway.relay import Relay, RelayLimits, tls_context

        assert self.keypair is not None
        context = None
        if self.settings.tls_cert is not None and self.settings.tls_key is not None:
            try:
                context = tls_context(str(self.settings.tls_cert), str(self.settings.tls_key))
            except (OSError, ValueError) as err:
                raise ConfigError("--tls-cert", f"cannot load the relay's certificate and key: {err}") from None
        host, port = self.settings.ws_listen
        self.relay = Relay(host=host, port=port, hub=("127.0.0.1", self.settings.listen_port),
                           private_key=self.keypair.private, is_peer=self.is_peer, ssl_context=context,
                           limits=RelayLimits(trusted_proxies=tuple(
                               ipaddress.ip_network(cidr) for cidr in self.settings.ws_trusted_proxies)))
        try:
            await self.relay.start()
        except OSError as err:
            raise EngineError(f"cannot serve the WebSocket relay on {host}:{port}: {err.strerror or err}") from None
        stack.push_async_callback(self.relay.close)

    async def _serve(self, stack: AsyncExitStack, registered: bool) -> None:
        """The long-running part: DNS, watch, background registration, until asked to stop."""
        assert self.registration is not None
        dns = None  # the DNS forwarder, with --dns-upstream
        await self._start_relay(stack)
        if self.settings.metrics_listen is not None:
            await self.metrics.serve(*self.settings.metrics_listen)
            stack.push_async_callback(self.metrics.close)
        try:
            async with asyncio.TaskGroup() as tg:
                if self.settings.dns_upstream is not None:
                    from anex_agent.gateway.dns import DnsForwarder  # dnspython: only with --dns-upstream

                    dns = DnsForwarder(listen_host=self.registration.address, upstream=self.settings.dns_upstream)
                    try:
                        await dns.serve(tg)
                    except OSError as err:
                        raise EngineError(f"cannot serve DNS on {self.registration.address}:53: "
                                          f"{err.strerror or err}") from None
                tg.create_task(self._watch_loop(), name="gateway-watch")
                tg.create_task(self._renew_loop(), name="gateway-credential")
                tg.create_task(self._save_loop(), name="gateway-state")
                if not registered:
                    tg.create_task(self._register_later(), name="gateway-register")
                tg.create_task(self._wait_stop(), name="gateway-stop")
                log.info("gateway up: %s %s listening on UDP %d, routes %s",
                         self.ifname, self.registration.interface_address, self.settings.listen_port,
                         ", ".join(self.settings.routes) or "none")
                self.ready.set()
        except* _Stop:
            log.info("gateway stopping")
            await self._leave()
        finally:
            if dns is not None:
                await dns.close()

    async def _leave(self) -> None:
        """Tell the coordinator this gateway is gone (nodes route through the others), within LEAVE_TIMEOUT s."""
        assert self.registration is not None
        try:
            async with asyncio.timeout(LEAVE_TIMEOUT):
                await self.link.gone(self.registration.gateway_id)
        except TimeoutError:
            log.warning("the coordinator did not take this gateway's stop within %.0f s; it will find the gateway "
                        "silent and leave it out of the nodes' configs after its --gateway-gone-after", LEAVE_TIMEOUT)
        except CoordinatorError as err:
            log.warning("telling the coordinator this gateway stops failed (%s); it will find the gateway silent "
                        "and leave it out of the nodes' configs after its --gateway-gone-after", err)
        else:
            log.info("the coordinator knows this gateway stopped: nodes route through the other gateways")

    async def _wait_stop(self) -> None:
        await self._stop.wait()
        raise _Stop()
