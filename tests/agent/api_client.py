"""A test client for :class:`anex_agent.agent.api.AgentApi`: the API served on a loopback port
and an aiohttp session pointed at it (``await client.get("/healthz")`` as with aiohttp's TestClient)."""

from __future__ import annotations

import socket

import aiohttp


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ApiClient:
    def __init__(self, api) -> None:
        self.api = api
        self.port = 0
        self.session: aiohttp.ClientSession | None = None

    async def start_server(self) -> None:
        self.port = free_port()
        await self.api.start("127.0.0.1", self.port)
        self.session = aiohttp.ClientSession(base_url=f"http://127.0.0.1:{self.port}")

    def make_url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def request(self, method: str, path: str, **kwargs):
        return self.session.request(method, path, **kwargs)

    def get(self, path: str, **kwargs):
        return self.session.get(path, **kwargs)

    def post(self, path: str, **kwargs):
        return self.session.post(path, **kwargs)

    def put(self, path: str, **kwargs):
        return self.session.put(path, **kwargs)

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
        await self.api.close()
