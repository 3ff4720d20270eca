"""The agent's calls to the coordinator, with errors translated at this edge.

Uses :mod:`anex_agent.client` (the coordinator's own client) when it provides what
the agent needs, otherwise talks the REST contract of :mod:`anex_agent.wire`
directly with aiohttp. Either way the agent sees one small interface:

    join(NodeJoinRequest) -> NodeJoinResponse
    get_config(node_id) -> NodeConfig
    heartbeat(node_id, Heartbeat) -> HeartbeatAck
    watch(since) -> async iterator of WatchEvent      (WebSocket; ends when the stream ends)

Every failure is a :class:`~anex_agent.errors.CoordinatorError`; ``retryable`` is true
for network errors, timeouts, 5xx and 429, false for other 4xx (the request itself is
wrong: retrying changes nothing). The credential is sent as ``Authorization: Bearer``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import TypeVar

import aiohttp
from pydantic import BaseModel, ValidationError

from anex_agent.errors import CoordinatorError
from anex_agent.wire import Heartbeat, HeartbeatAck, NodeConfig, NodeJoinRequest, NodeJoinResponse, WatchEvent

M = TypeVar("M", bound=BaseModel)

REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=15, connect=5)
WATCH_HEARTBEAT = 20.0  # seconds between WebSocket pings on the watch stream


def _retryable(status: int) -> bool:
    return status >= 500 or status in (408, 429)


class CoordinatorLink:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        self._credential: str | None = None
        self._session: aiohttp.ClientSession | None = None

    def set_credential(self, credential: str) -> None:
        self._credential = credential

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._credential}"} if self._credential else {}

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=REQUEST_TIMEOUT)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _call(self, method: str, path: str, model: type[M], body: BaseModel | None = None) -> M:
        url = f"{self.base_url}{path}"
        data = body.model_dump_json() if body is not None else None
        headers = {**self._headers(), **({"Content-Type": "application/json"} if data else {})}
        try:
            async with self._http().request(method, url, data=data, headers=headers) as resp:
                text = await resp.text()
                if resp.status >= 400:
                    raise _http_error(method, path, resp.status, text)
        except aiohttp.ClientError as err:
            raise CoordinatorError(f"cannot reach the coordinator ({_describe(err)})", retryable=True) from None
        except TimeoutError:
            raise CoordinatorError("the coordinator did not answer in time", retryable=True) from None
        try:
            return model.model_validate_json(text)
        except ValidationError:
            raise CoordinatorError(f"{method} {path}: the coordinator sent an answer we cannot read", retryable=True) from None

    async def join(self, request: NodeJoinRequest) -> NodeJoinResponse:
        return await self._call("POST", "/v1/nodes", NodeJoinResponse, request)

    async def get_config(self, node_id: str) -> NodeConfig:
        return await self._call("GET", f"/v1/nodes/{node_id}/config", NodeConfig)

    async def heartbeat(self, node_id: str, beat: Heartbeat) -> HeartbeatAck:
        return await self._call("POST", f"/v1/nodes/{node_id}/heartbeat", HeartbeatAck, beat)

    async def watch(self, since: int) -> AsyncIterator[WatchEvent]:
        """Yield watch events until the stream closes; raise CoordinatorError when it fails."""
        url = f"{self.base_url}/v1/watch?since={since}"
        try:
            async with self._http().ws_connect(url, headers=self._headers(), heartbeat=WATCH_HEARTBEAT, timeout=aiohttp.ClientWSTimeout(ws_close=5)) as ws:
                async for msg in ws:
                    if msg.type == aiohttp.WSMsgType.TEXT:
                        try:
                            yield WatchEvent.model_validate_json(msg.data)
                        except ValidationError:
                            raise CoordinatorError("the watch stream sent an event we cannot read", retryable=True) from None
                    elif msg.type in (aiohttp.WSMsgType.ERROR, aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED):
                        break
        except aiohttp.WSServerHandshakeError as err:
            raise CoordinatorError(f"watch refused with HTTP {err.status}", status=err.status, retryable=_retryable(err.status)) from None
        except aiohttp.ClientError as err:
            raise CoordinatorError(f"watch stream failed ({_describe(err)})", retryable=True) from None
        except TimeoutError:
            raise CoordinatorError("watch stream timed out", retryable=True) from None


def _describe(err: Exception) -> str:
    if isinstance(err, aiohttp.ClientConnectorError):
        return f"connection to {err.host}:{err.port} failed: {err.os_error.strerror or err.os_error}"
    return type(err).__name__


def _http_error(method: str, path: str, status: int, text: str) -> CoordinatorError:
    problem: dict = {}
    try:
        parsed = json.loads(text)
        problem = parsed if isinstance(parsed, dict) else {}
    except ValueError:
        pass
    detail = problem.get("detail") or problem.get("title") or text[:200]
    return CoordinatorError(f"{method} {path}: HTTP {status}: {detail}", status=status, retryable=_retryable(status), problem=problem)


async def _sleep(seconds: float) -> None:  # patched in tests
    await asyncio.sleep(seconds)
