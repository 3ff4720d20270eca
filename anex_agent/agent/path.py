"""The datagram path of a node: UDP, or the gateways' WebSocket relays; chosen, watched and switched.

``ANEX_PATH`` (:attr:`AgentSettings.path`):

* ``udp`` -- WireGuard over UDP, always.
* ``websocket`` -- always through each gateway's relay (gateways without a ``ws_url`` stay on UDP).
* ``auto`` (default) -- UDP first: before the engine is configured, a WireGuard handshake
  with the gateways over UDP must complete within :data:`PROBE_TIMEOUT` s
  (:func:`anex_agent.tunnels.binds.udp_probe.probe_gateway`), else the WebSocket path. Then it
  keeps watching, every :data:`CHECK_EVERY` s (probes then wait :data:`WATCH_PROBE_TIMEOUT` s):

  - on UDP: when nothing came from the gateways for :data:`STALL_AFTER` s, or the last
    handshake is older than :data:`HANDSHAKE_STALE` s, it probes UDP again; if that handshake
    fails, and a second probe with the longer :data:`CONFIRM_PROBE_TIMEOUT` fails too with
    nothing received from the gateways meanwhile, it moves to WebSocket (one slow answer from a
    busy gateway, or a busy node, does not move a working node off UDP). (The engine's send counter cannot tell: a local firewall
    refuses the send, and the engine counts nothing.) While the node stays quiet and the
    probes succeed, the next one waits twice as long, up to :data:`QUIET_PROBE_MAX` s: an idle
    node costs the gateway one handshake every half minute;
  - on WebSocket: every ``path_probe_interval`` s (``ANEX_PATH_PROBE_INTERVAL``, default
    :data:`PROBE_INTERVAL`) it probes UDP and returns when a handshake completes.

Where no gateway offers a relay (or ``ANEX_PATH=udp``) UDP is the only path, and it is
watched the same way (``ANEX_PATH=udp`` alone is never probed at start): when nothing came
back for a while and a probe's handshake fails, the node has **no path** -- reported as
``none`` with the reason -- until datagrams arrive from the gateways again or a probe (every
``path_probe_interval`` s) completes. ``ANEX_PATH=websocket`` with no relay offered is on UDP,
and says so.

Every switch is logged with its reason and kept (:meth:`PathManager.report`: ``/status``,
the heartbeat's transport status, the coordinator's node view). :meth:`PathManager.current`
is what is true now: ``udp``, ``websocket`` or ``none``; :attr:`PathManager.path` is only
which transport the engine is steered to (a gateway without a relay stays on UDP whatever it
says).

How the engine is put on the WebSocket path: the native engines own their UDP socket, so
each gateway gets a :class:`~anex_agent.tunnels.binds.ws.LocalRelay` (a UDP socket on
127.0.0.1 connected to the gateway's relay) and :meth:`PathManager.route` points that
gateway peer's endpoint at it. An engine that takes a Bind (``Engine.takes_bind``: the
userspace engine) is built with :meth:`PathManager.bind_factory`: its datagram transport is
a :class:`~anex_agent.tunnels.binds.switch.SwitchBind`, and :meth:`PathManager.route` moves each
gateway endpoint between UDP and the relay inside it, with no local UDP hop and no endpoint
change. The relay connections reconnect by themselves; a switch
re-applies the engine's config and asks for fresh handshakes, never restarting the engine or
the workload.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from anex_agent.wire.keys import KeyPair, decode_key
from anex_agent.tunnels.engines.config import DesiredConfig
from anex_agent.tunnels.os.netconf import split_host_port
from anex_agent.tunnels.binds.udp_probe import PROBE_TIMEOUT, ProbeResult, probe_gateway
from anex_agent.tunnels.binds.egress_proxy import proxy_for
from anex_agent.tunnels.binds.relay_client import RelayTarget
from anex_agent.tunnels.binds.switch import SwitchBind
from anex_agent.tunnels.binds.ws import LocalRelay
from anex_agent.wire.nodes import NodeConfig

if TYPE_CHECKING:
    from anex_agent.tasks import Tasks

log = logging.getLogger(__name__)

PATHS = ("auto", "udp", "websocket")
#: Seconds between UDP probes while on the WebSocket path (documented default; ANEX_PATH_PROBE_INTERVAL).
PROBE_INTERVAL = 120.0
#: Seconds between looks at the engine's counters.
CHECK_EVERY = 0.5
#: Seconds with nothing received from the gateways before UDP is probed.
STALL_AFTER = 2.0
#: How long a probe may take once running (UDP was working; a healthy gateway answers in well under a second).
WATCH_PROBE_TIMEOUT = 2.0
#: How long the second probe, which confirms that UDP stopped, may take (WireGuard's REKEY_TIMEOUT).
CONFIRM_PROBE_TIMEOUT = 5.0
#: Longest wait between probes while the node stays quiet and UDP keeps answering.
QUIET_PROBE_MAX = 30.0
#: A handshake older than this means handshakes stopped (REJECT_AFTER_TIME, whitepaper §6.1).
HANDSHAKE_STALE = 180.0
SWITCHES_KEPT = 20
NO_RELAY = "no gateway offers a WebSocket relay (ws_url) to fall back to"


@dataclass
class SilenceWatch:
    """Pure: says when nothing arrived from the gateways for long enough that UDP should be probed.

    The first wait is ``after`` s from the last datagram received; each probe that finds UDP
    working (:meth:`probed_ok`) doubles the wait, up to ``cap``; anything received resets it.
    """

    after: float = STALL_AFTER
    cap: float = QUIET_PROBE_MAX
    rx: int = -1
    since: float = 0.0
    wait: float = STALL_AFTER

    def observe(self, rx: int, now: float) -> bool:
        if rx != self.rx:  # something arrived (or the counters restarted)
            self.rx, self.since, self.wait = rx, now, self.after
            return False
        return now - self.since >= self.wait

    def probed_ok(self, now: float) -> None:
        self.since, self.wait = now, min(self.wait * 2, self.cap)

    def reset(self) -> None:
        self.rx = -1


@dataclass(frozen=True)
class PathSettings:
    mode: str = "auto"
    probe_interval: float = PROBE_INTERVAL
    probe_timeout: float = PROBE_TIMEOUT            # the first choice
    watch_probe_timeout: float = WATCH_PROBE_TIMEOUT  # later probes (the workload waits meanwhile)
    confirm_probe_timeout: float = CONFIRM_PROBE_TIMEOUT  # the second probe before UDP is called down
    stall_after: float = STALL_AFTER
    check_every: float = CHECK_EVERY
    proxy_env: tuple[tuple[str, str], ...] = ()      # HTTPS_PROXY / HTTP_PROXY / NO_PROXY, read at the edge
    ssl_context: ssl.SSLContext | None = dataclasses.field(default=None, compare=False)  # wss:// trust


def path_settings(settings: Any) -> PathSettings:
    """The path part of :class:`anex_agent.agent.settings.AgentSettings` (wss:// trusts ``ca_file`` too)."""
    from anex_agent.client.transport import client_ssl_context

    return PathSettings(mode=settings.path, probe_interval=settings.path_probe_interval,
                        proxy_env=settings.proxy_env,
                        ssl_context=client_ssl_context(settings.ca_file) if settings.ca_file else None)


@dataclass(frozen=True)
class Counters:
    rx: int
    tx: int
    handshake_age: float | None


async def _no_nudge() -> None:
    """The watch's ``nudge`` when none is given: nothing to send."""


class PathManager:
    """Owns the path choice and the relay connections; see the module docstring."""

    def __init__(self, settings: PathSettings, keypair: KeyPair) -> None:
        self.settings = settings
        self.keypair = keypair
        self.path = "websocket" if settings.mode == "websocket" else "udp"
        self.reason = f"ANEX_PATH={settings.mode}"
        self.since = time.time()
        self.switches: collections.deque[dict[str, Any]] = collections.deque(maxlen=SWITCHES_KEPT)
        self.relays: dict[str, LocalRelay] = {}  # gateway public key -> local relay
        self.last_probe: ProbeResult | None = None
        self._tasks: Tasks | None = None
        self._udp_endpoints: dict[str, tuple[str, int]] = {}  # gateway public key -> resolved UDP endpoint
        self._ws_urls: dict[str, str] = {}  # gateway public key -> relay URL
        self._stall = SilenceWatch(after=settings.stall_after, wait=settings.stall_after)
        self._switch: SwitchBind | None = None  # the engine's Bind, when it takes one
        self._takes_bind = False
        self.udp_down: str | None = None  # why UDP, the only path, does not work (None: it does, or not known)
        self._rx_when_down = 0
        self._next_udp_probe = 0.0

    # ---------------------------------------------------------------- the engine's config

    def learn(self, desired: DesiredConfig, config: NodeConfig) -> None:
        """Remember the gateways' UDP endpoints (resolved) and relay URLs from a config about to be applied."""
        by_key = {p.public_key: p for p in desired.peers}
        self._ws_urls = {gw.public_key: gw.ws_url for gw in config.gateways if gw.ws_url}
        self._udp_endpoints = {}
        for gw in config.gateways:
            peer = by_key.get(gw.public_key)
            if peer is not None and peer.endpoint:
                try:
                    self._udp_endpoints[gw.public_key] = split_host_port(peer.endpoint)
                except ValueError:
                    pass

    def bind_factory(self, tasks: Tasks, host: str = "0.0.0.0"):
        """For an engine that takes a Bind: ``async (listen_port) -> SwitchBind`` (UDP, and the relays on demand)."""
        self._tasks = tasks
        self._takes_bind = True

        async def factory(port: int | None) -> SwitchBind:
            self._switch = await SwitchBind.open(port, host, tasks, private_key=self.keypair.private,
                                                 public_key=self.keypair.public_b64)
            self._steer()
            return self._switch
        return factory

    def _steer(self) -> None:
        """Move each gateway endpoint of the engine's SwitchBind to the current path."""
        switch = self._switch
        if switch is None:
            return
        for key, endpoint in self._udp_endpoints.items():
            url = self._ws_urls.get(key)
            if self.path == "websocket" and url:
                switch.use_websocket(endpoint, self._target(key, url))
            else:
                switch.use_udp(endpoint)

    def _target(self, key: str, url: str) -> RelayTarget:
        return RelayTarget(url=url, gateway_public_key=decode_key(key, what="gateway public_key"),
                           proxy=proxy_for(url, dict(self.settings.proxy_env)), ssl_context=self.settings.ssl_context)

    async def route(self, desired: DesiredConfig, config: NodeConfig) -> DesiredConfig:
        """``desired`` for the current path: on WebSocket, gateway peers point at their local relays
        (an engine that takes a Bind keeps its endpoints; its SwitchBind is steered instead)."""
        self.learn(desired, config)
        if self._takes_bind:
            self._steer()  # the engine's SwitchBind, once it made one (its first apply), follows the path
            return desired
        if self.path != "websocket":
            return desired
        await self._ensure_relays()
        peers = tuple(
            dataclasses.replace(p, endpoint=self.relays[p.public_key].endpoint) if p.public_key in self.relays else p
            for p in desired.peers
        )
        return dataclasses.replace(desired, peers=peers)

    async def _ensure_relays(self) -> None:
        for key in [k for k, relay in self.relays.items() if self._ws_urls.get(k) != relay.client.target.url]:
            self.relays.pop(key).close()
        for key, url in self._ws_urls.items():
            if key in self.relays:
                continue
            relay = await LocalRelay.open(self._target(key, url), private_key=self.keypair.private, public_key=self.keypair.public_b64)
            self.relays[key] = relay
            if self._tasks is not None:
                self._tasks.spawn(f"ws-relay-{key[:8]}", relay.run)

    def _close_relays(self) -> None:
        for relay in self.relays.values():
            relay.close()
        self.relays.clear()

    async def close(self) -> None:
        self._close_relays()

    # ---------------------------------------------------------------- choice

    def can_switch(self) -> bool:
        return self.settings.mode == "auto" and bool(self._ws_urls)

    async def probe_udp(self, timeout: float | None = None) -> ProbeResult:
        """A WireGuard handshake over UDP with each gateway that has a relay (in parallel); ok when one completes."""
        targets = [(k, ep) for k, ep in self._udp_endpoints.items() if k in self._ws_urls] or list(
            self._udp_endpoints.items())
        if not targets:
            return ProbeResult(False, "no gateway has a UDP endpoint")
        results = await asyncio.gather(*(
            probe_gateway(self.keypair.private, decode_key(k, what="gateway public_key"), ep,
                          timeout=timeout or self.settings.probe_timeout) for k, ep in targets))
        self.last_probe = next((r for r in results if r.ok), results[0])
        return self.last_probe

    async def choose_initial(self, desired: DesiredConfig, config: NodeConfig, tasks: Tasks) -> str:
        """Pick the first path (``auto``: UDP when a handshake completes over it, else WebSocket)."""
        self._tasks = tasks
        self.learn(desired, config)
        if self.settings.mode == "websocket":
            if self._ws_urls:
                self._set("websocket", "ANEX_PATH=websocket")
            else:
                self.reason = ("ANEX_PATH=websocket, but no gateway offers a WebSocket relay (ws_url): on UDP "
                               "until one does")
                log.warning("path: %s", self.reason)
        elif self.can_switch():
            result = await self.probe_udp()
            self._set("udp" if result.ok else "websocket", result.reason)
        elif self.settings.mode == "auto":
            self.reason = "auto: no gateway advertises a WebSocket relay, UDP is the only path"
        return self.path

    def current(self) -> str:
        """The path datagrams take now: ``websocket`` (through a relay), ``udp``, or ``none`` (UDP is
        the only path and it does not work)."""
        if self.path == "websocket" and self._ws_urls:
            return "websocket"
        return "none" if self.udp_down is not None else "udp"

    def current_reason(self) -> str:
        return self.udp_down if self.current() == "none" and self.udp_down else self.reason

    def _udp_only(self) -> bool:
        """UDP is the only path: no relay to switch to (or not allowed to), and not steered to one."""
        return not self.can_switch() and self.current() != "websocket"

    def _mark_udp(self, down: str | None, rx: int = 0) -> None:
        """Record that UDP, the only path, stopped (``down``: why) or works again (None)."""
        before = self.current()
        self.udp_down = down
        self._rx_when_down = rx
        self._next_udp_probe = time.monotonic() + self.settings.probe_interval
        after = self.current()
        if after != before:
            reason = down or "UDP works again"
            self.switches.append({"at": round(time.time(), 3), "from": before, "to": after, "reason": reason})
            log.warning("path: %s -> %s: %s", before, after, reason)
            self.since = time.time()

    async def _watch_udp_only(self, counters: Callable[[], Awaitable[Counters]],
                              nudge: Callable[[], Awaitable[object]]) -> None:
        """One look at UDP when it is the only path: notice it stopped (a failed probe after silence)
        or works again (datagrams from the gateways, or a probe that completes)."""
        seen = await counters()
        now = time.monotonic()
        if self.udp_down is not None:
            if seen.rx > self._rx_when_down:
                self._mark_udp(None)
                self.reason = "UDP works again: datagrams arrive from the gateways"
            elif now >= self._next_udp_probe:
                result = await self.probe_udp()
                self._next_udp_probe = time.monotonic() + self.settings.probe_interval
                if result.ok:
                    await nudge()
                    self._mark_udp(None)
                    self.reason = f"UDP works again: {result.reason}"
            return
        why = self._udp_trouble(seen, now)
        if why is None:
            return
        result = await self._probe_quiet_udp(counters, seen)
        if result.ok:
            await nudge()
            self._stall.probed_ok(time.monotonic())
            return
        self._stall.reset()
        relay = (NO_RELAY if self.settings.mode != "udp" or not self._ws_urls
                 else "ANEX_PATH=udp keeps the node off the gateways' WebSocket relays")
        self._mark_udp(f"{why}; {result.reason}; {relay}", seen.rx)

    async def _probe_quiet_udp(self, counters: Callable[[], Awaitable[Counters]], seen: Counters) -> ProbeResult:
        """Whether UDP still works after the node went quiet: a probe with the watch's short timeout,
        then, if it failed, a second one with :attr:`PathSettings.confirm_probe_timeout`. Failed only
        when both failed and nothing arrived from the gateways since ``seen`` was read."""
        arrived = ProbeResult(True, "datagrams arrived from the gateways while the probe waited")
        result = await self.probe_udp(self.settings.watch_probe_timeout)
        if result.ok:
            return result
        if (await counters()).rx > seen.rx:
            return arrived
        log.info("path: a UDP probe failed (%s); probing once more before calling UDP down", result.reason)
        result = await self.probe_udp(self.settings.confirm_probe_timeout)
        if not result.ok and (await counters()).rx > seen.rx:
            return arrived
        return result

    def _udp_trouble(self, seen: Counters, now: float) -> str | None:
        """Why UDP looks broken at ``now`` (nothing received for the stall time, or a stale
        handshake), feeding ``seen`` to the stall detector; None while it looks fine."""
        quiet = now - self._stall.since
        stalled = self._stall.observe(seen.rx, now)
        if stalled:
            return f"nothing received from the gateways for {quiet:.0f} s"
        if seen.handshake_age is not None and seen.handshake_age > HANDSHAKE_STALE:
            return f"last handshake {seen.handshake_age:.0f} s ago"
        return None

    def _set(self, path: str, reason: str) -> bool:
        changed = path != self.path
        if changed:
            self.switches.append({"at": round(time.time(), 3), "from": self.path, "to": path, "reason": reason})
            log.warning("path: %s -> %s: %s", self.path, path, reason)
            self.since = time.time()
        else:
            log.info("path: %s (%s)", path, reason)
        self.path, self.reason = path, reason
        return changed

    async def watch(self, counters: Callable[[], Awaitable[Counters]], reapply: Callable[[], Awaitable[None]],
                    reset: Callable[[], Awaitable[bool]], nudge: Callable[[], Awaitable[object]] = _no_nudge) -> None:
        """Watch the current path (auto only) and switch when it stops working; runs until cancelled.

        ``await nudge()`` makes the engine send a keepalive to the gateways now (the data plane's:
        :meth:`~anex_agent.tunnels.engines.base.Engine.send_keepalive`): after a probe that succeeded,
        the gateway answers the probe's socket until the engine's next datagram."""
        next_probe = time.monotonic() + self.settings.probe_interval
        while True:
            await asyncio.sleep(self.settings.check_every)
            if not self.can_switch():
                if self._udp_only():
                    await self._watch_udp_only(counters, nudge)
                continue
            if self.udp_down is not None:  # a relay came: the regular watch takes over
                self._mark_udp(None)
            if self.path == "udp":
                seen = await counters()
                why = self._udp_trouble(seen, time.monotonic())
                if why is None:
                    continue
                result = await self._probe_quiet_udp(counters, seen)
                if result.ok:
                    await nudge()
                    self._stall.probed_ok(time.monotonic())
                    log.debug("path: %s, but %s; staying on UDP", why, result.reason)
                    continue
                self._stall.reset()
                await self.switch("websocket", f"{why}; {result.reason}", reapply, reset)
                next_probe = time.monotonic() + self.settings.probe_interval
            elif time.monotonic() >= next_probe:
                result = await self.probe_udp()
                next_probe = time.monotonic() + self.settings.probe_interval
                if result.ok:
                    await self.switch("udp", f"UDP works again: {result.reason}", reapply, reset)

    async def switch(self, path: str, reason: str, reapply: Callable[[], Awaitable[None]],
                     reset: Callable[[], Awaitable[bool]]) -> None:
        """Move to ``path``: re-apply the engine's config for it and ask for fresh handshakes over it."""
        if not self._set(path, reason):
            return
        await reapply()
        if path == "udp":
            self._close_relays()
        self._stall.reset()
        await reset()

    # ---------------------------------------------------------------- reports

    def report(self) -> dict[str, Any]:
        return {
            "mode": self.settings.mode,
            "current": self.current(),
            "reason": self.current_reason(),
            "since": round(self.since, 3),
            "probe_interval": self.settings.probe_interval,
            "last_udp_probe": self.last_probe.to_dict() if self.last_probe else None,
            "switches": list(self.switches),
            "relays": (self._switch.report() if self._switch is not None
                       else {key[:8]: relay.client.report() for key, relay in self.relays.items()}),
        }
