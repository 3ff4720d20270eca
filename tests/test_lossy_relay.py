"""The delay-and-loss emulator (tools/lossy-relay): built by scripts/build-lossy-relay, it relays
both ways, drops what --loss says, holds datagrams --delay ms, lets reordered ones be overtaken,
and names a bad argument in one line."""

from __future__ import annotations

import json
import socket
import subprocess
import time

import pytest

from integration.lossy import relay_args, relay_binary


@pytest.fixture(scope="module")
def binary():
    path = relay_binary()
    if path is None:
        pytest.skip("no C compiler (cc) to build tools/lossy-relay")
    return path


@pytest.fixture
def path(binary):
    """A factory of relay paths; whatever a failed test left running is stopped afterwards."""
    made: list[Path_] = []

    def make(**shape) -> Path_:
        made.append(Path_(binary, **shape))
        return made[-1]

    yield make
    for p in made:
        if p.relay.poll() is None:
            p.relay.kill()
            p.relay.wait()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Path_:
    """A relay between a client socket and an echoing upstream socket."""

    def __init__(self, binary: str, **shape) -> None:
        self.up = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.up.bind(("127.0.0.1", 0))
        self.forced = True  # the buffers hold a whole burst (else the kernel caps them at rmem_max)
        for sock in (self.up, self.client):  # room for a whole burst (small datagrams cost ~1 KiB each)
            try:
                sock.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)  # SO_RCVBUFFORCE (root)
            except PermissionError:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
                self.forced = False
        self.client.settimeout(30)
        self.up.settimeout(30)
        port = free_port()
        self.relay = subprocess.Popen([binary, "--listen", f"127.0.0.1:{port}",
                                       "--upstream", f"127.0.0.1:{self.up.getsockname()[1]}", *relay_args(**shape)],
                                      stdout=subprocess.PIPE, text=True)
        assert self.relay.stdout.readline().strip() == "ready"
        self.addr = ("127.0.0.1", port)

    def counts(self) -> dict:
        counts = self.counts_keeping_upstream()
        self.up.close()
        return counts

    def counts_keeping_upstream(self) -> dict:
        """Stop the relay and read its counts; what it forwarded stays readable on ``up``."""
        self.relay.terminate()
        out, _ = self.relay.communicate(timeout=30)
        self.client.close()
        return json.loads(out.strip().splitlines()[-1])


def test_relays_both_ways_in_order_without_loss(path):
    p = path()
    for i in range(200):
        p.client.sendto(i.to_bytes(4, "big"), p.addr)
    got = [p.up.recvfrom(100) for _ in range(200)]
    assert [int.from_bytes(d, "big") for d, _ in got] == list(range(200))
    relay_addr = got[0][1]
    p.up.sendto(b"back", relay_addr)  # the upstream's answer goes to the last client
    assert p.client.recvfrom(100)[0] == b"back"
    assert p.counts() == {"forwarded": 201, "dropped": 0, "reordered": 0, "overflow": 0}


MARKERS = 20  # sent after the burst: all of them dropped at a loss of 0.3 is a 3e-11 chance


def test_loss_drops_about_the_share_asked(path):
    p = path(loss=0.3, seed=5)
    if not p.forced:
        pytest.skip("needs root: without SO_RCVBUFFORCE a socket buffer can drop part of the "
                    "2000-datagram burst before the relay counts it")
    for i in range(2000):
        p.client.sendto(i.to_bytes(4, "big"), p.addr)
    for k in range(MARKERS):  # numbered markers: the relay handles datagrams in the order sent
        p.client.sendto(b"marker" + bytes([k]), p.addr)
    burst, markers = 0, []
    while not markers:  # the first marker through: every datagram of the burst went through before it
        data = p.up.recvfrom(100)[0]  # the socket's generous timeout is the deadline
        if data.startswith(b"marker"):
            markers.append(data[6])
        else:
            burst += 1
    counts = p.counts_keeping_upstream()
    for _ in range(counts["forwarded"] - burst - len(markers)):  # what it forwarded before stopping
        data = p.up.recvfrom(100)[0]
        assert data.startswith(b"marker")
        markers.append(data[6])
    p.up.close()
    # it handled the burst and markers 0..last in order, and was stopped somewhere after the first
    handled_markers = counts["forwarded"] + counts["dropped"] - 2000
    assert markers == sorted(markers) and markers[-1] < handled_markers <= MARKERS
    assert 400 < 2000 - burst < 800
    assert counts["overflow"] == 0


def test_delay_holds_each_datagram(path):
    p = path(delay_ms=80)
    sent = time.monotonic()
    p.client.sendto(b"x", p.addr)
    assert p.up.recvfrom(100)[0] == b"x"
    assert time.monotonic() - sent >= 0.079  # never earlier than the delay (a busy machine only adds)
    p.counts()


def test_reordered_datagrams_are_overtaken(path):
    p = path(reorder=0.2, seed=3)
    for i in range(500):
        p.client.sendto(i.to_bytes(4, "big"), p.addr)
    order = [int.from_bytes(p.up.recvfrom(100)[0], "big") for _ in range(500)]
    assert sorted(order) == list(range(500))
    assert order != list(range(500))
    assert p.counts()["reordered"] > 0


def test_sigterm_stops_an_idle_relay(path):
    """Nothing held, so it waits without a timeout: a SIGTERM arriving just before that wait
    must still end it (the signal is only unblocked inside ppoll). Stopped right after it is
    ready, many times over, to land in that window now and then."""
    for _ in range(20):
        p = path()
        counts = p.counts()  # terminate, then wait for its counts (generous deadline)
        assert counts == {"forwarded": 0, "dropped": 0, "reordered": 0, "overflow": 0}


@pytest.mark.parametrize(("args", "names"), [
    (["--listen", "127.0.0.1:1", "--upstream", "nowhere"], "--upstream"),
    (["--listen", "127.0.0.1:1", "--upstream", "127.0.0.1:2", "--loss", "2"], "--loss"),
    (["--listen", "127.0.0.1:1"], "--upstream"),
    (["--bogus", "1"], "--bogus"),
])
def test_bad_arguments_are_named_in_one_line(binary, args, names):
    out = subprocess.run([binary, *args], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and names in out.stderr
