"""Heartbeats and the watch stream: the agent's two long-running coordinator tasks.

Both are fail static: a failure only marks the coordinator unreachable and backs off
(exponential, jittered, capped) before the next try; the data plane keeps running on the
last good config. Neither ever raises out of its loop except on cancellation.

* :func:`heartbeat_loop` sends status (engine, path, handshake age, byte counters) and,
  when :mod:`anex_agent.gpu` provides ``collect_telemetry()``, the telemetry block;
  it waits ``next_heartbeat_in`` from the ack. When the ack says the coordinator holds
  a newer config than ours, it fetches and applies it (a watch event may have been lost).
* :func:`watch_loop` follows ``GET /v1/watch?since=<version>`` and applies every
  ``snapshot`` / ``config`` / ``gateway_changed`` event's config.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from anex_agent.agent.backoff import Backoff
from anex_agent.errors import AnexError, CoordinatorError
from anex_agent.wire import Heartbeat

if TYPE_CHECKING:
    from anex_agent.agent.supervisor import Agent

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 10.0  # seconds, until the coordinator says otherwise
MIN_INTERVAL = 1.0
MAX_BACKOFF = 60.0


async def collect_telemetry() -> dict[str, Any] | None:
    """GPU telemetry from :mod:`anex_agent.gpu` when it provides it (off the event loop), else None."""
    try:
        from anex_agent import gpu
    except ImportError:
        return None
    collect = getattr(gpu, "collect_telemetry", None)
    if collect is None:
        return None
    try:
        if asyncio.iscoroutinefunction(collect):
            return await collect()
        return await asyncio.to_thread(collect)
    except Exception as err:  # telemetry must never stop heartbeats
        log.warning("GPU telemetry failed: %s", err)
        return None


async def heartbeat_loop(agent: Agent) -> None:
    backoff = Backoff(base=1.0, cap=MAX_BACKOFF)
    interval = DEFAULT_INTERVAL
    while True:
        assert agent.identity is not None and agent.dataplane is not None
        try:
            status = await agent.dataplane.transport_status()
            version = agent.dataplane.config.version if agent.dataplane.config else 0
            beat = Heartbeat(status=status, config_version=version, telemetry=await collect_telemetry())
            ack = await agent.link.heartbeat(agent.identity.node_id, beat)
            if not agent.coordinator_reachable:
                log.info("coordinator reachable again")
            agent._reachable(True)
            backoff.reset()
            interval = max(MIN_INTERVAL, ack.next_heartbeat_in)
            if ack.config_version > version:
                config = await agent.link.get_config(agent.identity.node_id)
                await agent.apply_config(config)
            await asyncio.sleep(interval)
        except CoordinatorError as err:
            agent._reachable(False, str(err))
            delay = min(backoff.next_delay(), max(interval, MAX_BACKOFF))
            log.warning("heartbeat failed (%s); keeping the last good config, next try in %.1f s", err, delay)
            await asyncio.sleep(delay)
        except AnexError as err:  # applying a config failed: keep running, try again later
            log.error("applying the coordinator's config failed: %s", err)
            await asyncio.sleep(backoff.next_delay())


async def watch_loop(agent: Agent) -> None:
    backoff = Backoff(base=1.0, cap=MAX_BACKOFF)
    while True:
        assert agent.dataplane is not None
        since = agent.dataplane.config.version if agent.dataplane.config else 0
        try:
            async for event in agent.link.watch(since):
                backoff.reset()
                agent._reachable(True)
                if event.config is not None and event.type in ("snapshot", "config", "gateway_changed"):
                    log.info("watch: %s event, config version %d", event.type, event.version)
                    await agent.apply_config(event.config)
            delay = backoff.next_delay()
            log.info("watch stream closed; reconnecting in %.1f s", delay)
        except CoordinatorError as err:
            agent._reachable(False, str(err))
            delay = backoff.next_delay()
            log.warning("watch stream failed (%s); reconnecting in %.1f s", err, delay)
        except AnexError as err:
            delay = backoff.next_delay()
            log.error("applying a watched config failed: %s; resyncing in %.1f s", err, delay)
        await asyncio.sleep(delay)
