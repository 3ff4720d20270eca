"""The coordinator's process-wide state, handed to every route module as ``ctx``.

Contract:
* :meth:`Coordinator.open` connects the database, applies migrations (core ones plus
  those of the route modules, by default ``modules.ROUTE_MODULES``), loads the admin token
  the signing key, the coordinator key (join proofs) and the SSH CA key (:mod:`.ssh_ca`).
* :meth:`Coordinator.start` preloads the credential cache (every node's and gateway's
  credentials, so the first heartbeats after a restart need no query) and starts the background work, all named tasks in one
  ``TaskGroup`` owned by a single runner task: the change feed, the heartbeat flusher,
  the state sweeper and the change-log pruner. :meth:`Coordinator.close` cancels them,
  flushes buffered heartbeats and closes the database.
* ``clock`` (seconds since the epoch) is injectable for tests; nothing else reads time.
* Extension points: ``ctx.metrics.registry`` (add Prometheus collectors with
  ``ctx.metrics.add_collector``), ``ctx.feed.add_listener`` (see every change),
  ``ctx.add_background(name, coro_factory)`` (before :meth:`start`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from anex_agent.coordinator import (
    changes,
    coordinator_key,
    credentials,
    limits,
    migrations,
    signing,
    ssh_ca,
    sweeper,
)
from anex_agent.coordinator.routes import modules
from anex_agent.coordinator.auth import Authenticator
from anex_agent.coordinator.db import Database, open_database
from anex_agent.coordinator.gatewayset import GatewaySetCache
from anex_agent.coordinator.heartbeats import HeartbeatBuffer
from anex_agent.coordinator.metrics import Metrics, load_metrics_token
from anex_agent.coordinator.settings import Settings
from anex_agent.coordinator.versions import ConfigVersions

log = logging.getLogger(__name__)

STOP_TIMEOUT = 10.0  # seconds background tasks get to stop on close


class Coordinator:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        *,
        admin_token: str,
        admin_token_source: str,
        signing_key: bytes,
        verify_key: str,
        clock: Callable[[], float],
        coordinator_private: bytes = b"",
        coordinator_public: str = "",
        metrics_token: str | None = None,
        ssh_authority: ssh_ca.CertificateAuthority | None = None,
        ssh_issuer_token: str | None = None,
    ) -> None:
        self.settings = settings
        self.db = db
        self.clock = clock
        self.admin_token = admin_token
        self.admin_token_source = admin_token_source
        self.signing_key = signing_key
        self.verify_key = verify_key
        self.coordinator_private = coordinator_private  # X25519: join proofs (coordinator_key.py)
        self.coordinator_public = coordinator_public
        self.ssh_ca = ssh_authority  # remote access: signs host and user certificates (ssh_ca.py)
        self.feed = changes.ChangeFeed(db, poll_interval=settings.poll_interval, queue_size=settings.limits.watch_queue)
        self.auth = Authenticator(db, admin_token, metrics_token=metrics_token, clock=clock,
                                  ssh_issuer_token=ssh_issuer_token)
        self.failed_auths = limits.FailedAuths(settings.limits, clock)
        self.heartbeats = HeartbeatBuffer(db)
        self.metrics = Metrics()
        self.versions = ConfigVersions(db)
        self.gateway_set = GatewaySetCache()
        self.auth.on_node_loaded = self.versions.seed
        self.started_at = clock()  # when this process started serving (start() sets it again)
        self.websockets: set = set()  # open watch streams, closed (1001) on shutdown
        self.join_lock = asyncio.Lock()  # one join at a time per process; across processes the database decides
        self._background: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        self._runner: asyncio.Task | None = None
        self.feed.add_listener(self.auth.on_change)
        self.feed.add_listener(self.versions.on_change)
        self.feed.add_listener(self._forget_deleted_node)
        self.feed.add_listener(lambda _change: self.metrics.changes_delivered.inc())

    @classmethod
    async def open(
        cls,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.time,
        extra_migrations: Iterable[migrations.Migration] | None = None,
        environ: dict[str, str] | None = None,
        signing_key_file: Path | None = None,
        coordinator_key_file: Path | None = None,
    ) -> Coordinator:
        admin_token, source = credentials.load_admin_token(settings.state_dir, environ)
        metrics_token = load_metrics_token(settings.metrics_token_file, environ)
        ssh_issuer_token = ssh_ca.load_issuer_token(settings.ssh_issuer_token_file)
        key_path = signing_key_file or settings.state_dir / signing.FILE_NAME
        signing_key = signing.load_or_create(key_path)
        coord_key_path = coordinator_key_file or settings.state_dir / coordinator_key.FILE_NAME
        coordinator_private = coordinator_key.load_or_create(coord_key_path)
        ssh_ca_path = settings.ssh_ca_key_file or settings.state_dir / ssh_ca.FILE_NAME
        ssh_ca_private = ssh_ca.load_or_create(ssh_ca_path)
        if extra_migrations is None:  # those of the default route modules (modules.ROUTE_MODULES)
            extra_migrations = modules.module_migrations(modules.load_modules())
        db = await open_database(settings.database_url, password=settings.database_password)
        try:
            await migrations.apply(db, [*migrations.CORE, *extra_migrations], clock=clock)
            verify_key = await signing.register(db, signing_key, key_path=key_path)
            coordinator_public = await coordinator_key.register(db, coordinator_private, key_path=coord_key_path)
            ssh_ca_public = await ssh_ca.register(db, ssh_ca_private, key_path=ssh_ca_path,
                                                  previous=settings.ssh_ca_previous)
        except BaseException:
            await db.close()
            raise
        return cls(
            settings,
            db,
            admin_token=admin_token,
            admin_token_source=source,
            signing_key=signing_key,
            verify_key=verify_key,
            clock=clock,
            coordinator_private=coordinator_private,
            coordinator_public=coordinator_public,
            metrics_token=metrics_token,
            ssh_authority=ssh_ca.CertificateAuthority(ssh_ca_private, ssh_ca_public, settings.ssh_ca_previous),
            ssh_issuer_token=ssh_issuer_token,
        )

    def _forget_deleted_node(self, change: changes.Change) -> None:
        if change.scope == changes.Scope.ONE_NODE and change.type == changes.ChangeType.DELETED and change.target:
            self.heartbeats.forget(change.target)

    def add_background(self, name: str, factory: Callable[[], Awaitable[None]]) -> None:
        """Run ``factory()`` as a named task for the coordinator's lifetime (call before start)."""
        self._background.append((name, factory))

    async def start(self) -> None:
        self.started_at = self.clock()
        await self.feed.start()
        await self.versions.load()
        started = time.perf_counter()
        loaded = await self.auth.preload()  # after the feed's start: changes from here on still reach the cache
        log.info("credential cache: %d nodes and gateways loaded in %.2f s", loaded, time.perf_counter() - started)
        tasks: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("change-feed", self.feed.run),
            ("state-sweeper", lambda: sweeper.run(self)),
            *self._background,
        ]
        if self.settings.heartbeat_flush_interval > 0:
            tasks.append(("heartbeat-flush", lambda: self.heartbeats.run(self.settings.heartbeat_flush_interval)))

        async def runner() -> None:
            async with asyncio.TaskGroup() as group:
                for name, factory in tasks:
                    group.create_task(factory(), name=f"coordinator-{name}")

        self._runner = asyncio.create_task(runner(), name="coordinator-background")

    def committed(self) -> None:
        """Call after committing a change: watchers in this process see it at once."""
        self.feed.poke()

    async def close(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            done, _ = await asyncio.wait({self._runner}, timeout=STOP_TIMEOUT)
            if not done:  # a background task ignores cancellation: say so, do not hang
                log.error("background tasks did not stop within %.0fs: %s", STOP_TIMEOUT,
                          ", ".join(t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("coordinator-")))
            elif not self._runner.cancelled() and self._runner.exception() is not None:
                log.error("background task failed", exc_info=self._runner.exception())
            self._runner = None
        try:
            await self.heartbeats.flush()
        except Exception:
            log.exception("final heartbeat flush failed")
        await self.db.close()
