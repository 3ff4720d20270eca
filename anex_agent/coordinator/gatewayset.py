"""Per-process memo of the gateway set, so a gateway change fans out to N node watchers
with one database read instead of N.

Contract: :meth:`GatewaySetCache.get` returns a gateway list read at or after change-log
version ``version`` (it reloads when asked for a newer version than it holds); concurrent
callers share one load.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


class GatewaySetCache:
    def __init__(self) -> None:
        self._version = -1
        self._peers: list[Any] = []
        self._lock = asyncio.Lock()
        self.loads = 0

    async def get(self, version: int, load: Callable[[], Awaitable[list[Any]]]) -> list[Any]:
        async with self._lock:
            if version > self._version:
                self._peers = await load()
                self._version = version
                self.loads += 1
            return self._peers
