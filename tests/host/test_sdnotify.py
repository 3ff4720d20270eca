"""The systemd notify protocol against a real NOTIFY_SOCKET datagram socket, and the watchdog."""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid

import pytest

from anex_agent.host.sdnotify import Notifier
from tests.polling import wait_for, wait_until


@pytest.fixture
def listener(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tmp_path / "notify"
    sock.bind(str(path))
    sock.setblocking(False)
    yield str(path), sock
    sock.close()


def received(sock) -> list[str]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


def test_ready_and_status_reach_the_socket(listener):
    path, sock = listener
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": path})
    assert notifier.enabled and notifier.watchdog_interval is None
    assert notifier.notify(READY=1, STATUS="tunnel up: two\nlines")
    assert received(sock) == ["READY=1\nSTATUS=tunnel up: two lines\n"]


def test_abstract_socket():
    name = f"anex-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(2)
    try:
        assert Notifier.from_environ({"NOTIFY_SOCKET": "@" + name}).notify(STOPPING=1)
        assert sock.recv(100) == b"STOPPING=1\n"
    finally:
        sock.close()


def test_without_notify_socket_nothing_is_sent_and_a_dead_socket_does_not_raise(tmp_path):
    assert not Notifier.from_environ({}).notify(READY=1)
    assert not Notifier.from_environ({"NOTIFY_SOCKET": str(tmp_path / "gone")}).notify(READY=1)


def test_watchdog_settings():
    pid = os.getpid()
    assert Notifier.from_environ({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "30000000"}).watchdog_interval == 15.0
    assert Notifier.from_environ({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(pid)},
                                 pid=pid).watchdog_interval == 1.0
    # meant for another process (a parent that exec'd us without unsetting it): not ours
    assert Notifier.from_environ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(pid + 1)}, pid=pid).watchdog_interval is None
    for bad in ("", "0", "-5", "1e6", "١٢"):
        assert Notifier.from_environ({"WATCHDOG_USEC": bad}).watchdog_interval is None
    env = {"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "1", "WATCHDOG_PID": "1", "PATH": "/bin"}
    Notifier.scrub(env)
    assert env == {"PATH": "/bin"}


async def test_watchdog_pings_from_the_event_loop_and_a_stuck_loop_stops_them(listener):
    path, sock = listener
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "100000"})  # ping every 0.05 s
    task = asyncio.create_task(notifier.watchdog(), name="watchdog")
    stamps = []

    async def collect(at_least: int) -> None:
        """Gather pings until ``at_least`` were seen (the deadline only bounds a failing test)."""
        async def seen():
            stamps.extend(time.monotonic() for msg in received(sock) if msg == "WATCHDOG=1\n")
            return len(stamps) >= at_least
        await wait_until(seen, what=f"{at_least} watchdog pings", interval=0.01)

    await collect(5)
    assert len(stamps) >= 5
    before = len(stamps)
    time.sleep(0.6)  # the event loop is stuck: no ping goes out meanwhile
    stuck_pings = len(received(sock))
    assert stuck_pings <= 1  # at most the one already due when the loop froze
    await collect(before + 1)
    assert len(stamps) > before
    task.cancel()


async def test_supervised_announces_ready_and_stopping(listener):
    path, sock = listener
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": path})
    ready = asyncio.Event()

    async def main():
        await asyncio.sleep(0.05)
        assert received(sock) == []  # nothing before the role says it is ready
        ready.set()
        await asyncio.sleep(0.05)
        return 42

    from anex_agent.host.sdnotify import supervised

    assert await supervised(main(), notifier, ready, "up") == 42
    assert received(sock) == ["READY=1\nSTATUS=up\n", "STOPPING=1\nSTATUS=stopping\n"]


def test_the_coordinator_process_notifies_systemd(tmp_path, listener):
    import subprocess
    import sys

    path, sock = listener
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000", "ANEX_ADMIN_TOKEN": "sdnotify-test-admin-0123456789"}
    proc = subprocess.Popen([sys.executable, "-m", "anex_agent", "coordinator", "--listen", f"127.0.0.1:{port}",
                             "--state-dir", str(tmp_path / "coord")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    messages: list[str] = []
    try:
        wait_for(lambda: messages.extend(received(sock)) or any("READY=1" in m for m in messages), what="READY=1")
        assert f"READY=1\nSTATUS=listening on 127.0.0.1:{port}\n" in messages
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # READY=1 came once it was listening
        later: list[str] = []
        wait_for(lambda: later.extend(received(sock)) or "WATCHDOG=1\n" in later, what="a watchdog ping")
        assert later.count("WATCHDOG=1\n") >= 1
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "STOPPING=1\nSTATUS=stopping\n" in received(sock)


async def test_supervised_raises_the_role_error_itself(listener):
    from anex_agent.errors import ConfigError
    from anex_agent.host.sdnotify import supervised

    path, sock = listener

    async def main():
        raise ConfigError("--listen", "cannot listen")

    with pytest.raises(ConfigError):  # not an ExceptionGroup: the CLI prints its one line
        await supervised(main(), Notifier.from_environ({"NOTIFY_SOCKET": path}), asyncio.Event(), "up")
    assert received(sock) == ["STOPPING=1\nSTATUS=stopping\n"]
