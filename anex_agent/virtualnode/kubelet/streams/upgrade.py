"""Taking over an aiohttp request's connection after ``101 Switching Protocols`` (SPDY/3.1, WebSocket).

Contract: :func:`upgrade` answers 101 with the headers it is given (for SPDY, :func:`spdy_headers`:
``Connection: Upgrade``, ``Upgrade: SPDY/3.1`` and ``X-Stream-Protocol-Version: <protocol>``, as
``httpstream/spdy``'s response upgrader does; for a WebSocket, the handshake's), then returns an :class:`UpgradedPipe`: what the client sends next arrives on its ``reader`` (EOF when
the client goes away), what is written goes to the client raw. Reading pauses the socket when
the reader holds more than its limit. The handler keeps the connection until it returns; aiohttp
then closes it (no keep-alive after an upgrade).

:func:`wants_spdy` says whether a request asks for the SPDY upgrade at all.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

SPDY = "SPDY/3.1"
PROTOCOL_HEADER = "X-Stream-Protocol-Version"
READER_LIMIT = 256 * 1024


def wants_spdy(request: web.Request) -> bool:
    connection = {item.strip().lower() for item in request.headers.get("Connection", "").split(",")}
    return "upgrade" in connection and request.headers.get("Upgrade", "").strip().lower() == SPDY.lower()


class _Feed:
    """What aiohttp's protocol feeds after the upgrade (its ``set_parser`` contract)."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        self.reader.feed_data(data)
        return False, b""

    def feed_eof(self) -> None:
        self.reader.feed_eof()


class UpgradedPipe:
    """The raw connection after 101: ``reader`` in, ``write``/``drain``/``close`` out."""

    def __init__(self, request: web.Request, reader: asyncio.StreamReader, response: web.StreamResponse) -> None:
        self._request = request
        self.response = response  # what the handler returns once the session is over
        self._transport = request.transport
        self.reader = reader

    def write(self, data: bytes) -> None:
        if self._transport is None or self._transport.is_closing():
            raise ConnectionResetError("the client went away")
        self._transport.write(data)

    async def drain(self) -> None:
        await self._request.protocol._drain_helper()  # aiohttp's own writers wait on it too

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


def spdy_headers(protocol: str) -> dict[str, str]:
    return {"Connection": "Upgrade", "Upgrade": SPDY, PROTOCOL_HEADER: protocol}


async def upgrade(request: web.Request, headers: dict[str, str]) -> UpgradedPipe:
    """Answer 101 with ``headers`` (:func:`spdy_headers`, or a WebSocket handshake's) and take the
    connection over."""
    response = web.StreamResponse(status=101, headers=headers)
    await response.prepare(request)
    reader = asyncio.StreamReader(limit=READER_LIMIT)
    if request.transport is not None:
        reader.set_transport(request.transport)
    request.protocol.keep_alive(False)
    request.protocol.set_parser(_Feed(reader))  # type: ignore[arg-type]
    return UpgradedPipe(request, reader, response)
