"""The relay's listening socket resets a refused connection at accept, before asyncio sees it."""

from __future__ import annotations

import socket

import pytest

from anex_agent.gateway.relay_listener import REFUSED_PER_WAKEUP, listen


def test_refused_connections_are_reset_and_the_others_accepted():
    server = listen("127.0.0.1", 0, 128)
    port = server.getsockname()[1]
    server.refuse = lambda address: address[0] == "127.0.0.2"
    try:
        stranger = socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0))
        node = socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.1", 0))
        server.setblocking(True)
        server.settimeout(10)
        conn, address = server.accept()  # the stranger's connection was skipped
        assert address[0] == "127.0.0.1"
        conn.close()
        stranger.settimeout(10)
        with pytest.raises(ConnectionResetError):
            stranger.recv(1)
        node.close()
    finally:
        server.close()


def test_refusals_are_spread_over_wake_ups():
    server = listen("127.0.0.1", 0, 512)
    port = server.getsockname()[1]
    server.refuse = lambda address: True
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(REFUSED_PER_WAKEUP + 1)]
    try:
        server.setblocking(True)  # connections wait: only the per-call bound ends accept()
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        for c in clients:
            c.close()
        server.close()


def test_an_ipv6_address_listens_on_ipv6_only():
    try:
        server = listen("::1", 0, 16)
    except OSError:
        pytest.skip("no IPv6 loopback here")
    try:
        assert server.family == socket.AF_INET6
        assert server.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 1
    finally:
        server.close()
