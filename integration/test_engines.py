"""The wireguard-go engine for real: two network namespaces joined by a veth pair, our engine code on both sides.

Each side runs ``integration/engine_driver.py`` (our engine behind a JSON line protocol)
under ``ip netns exec``, so the engine, wireguard-go, the UAPI socket, netlink and the
routes are all real. Skipped with the reason where root or wireguard-go is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from anex_agent.testing.mesh import wait_until
from anex_agent.wire.keys import encode_key, generate_private_key, public_key

from integration.netns import Netns, missing_prerequisites, read_line, unique, veth

REASON = missing_prerequisites("wireguard-go", "ping")
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

DRIVER = str(Path(__file__).with_name("engine_driver.py"))
REPO = str(Path(__file__).resolve().parent.parent)
RTPROT_ANEX = "97"  # netconf.RTPROT_ANEX, as `ip route` prints it


class Side:
    """One engine in one namespace, driven over the driver's stdin/stdout."""

    def __init__(self, ns: Netns, ifname: str) -> None:
        self.ns, self.ifname = ns, ifname
        self.key = generate_private_key()
        env = {**os.environ, "PYTHONPATH": REPO}
        self.proc = ns.popen([sys.executable, DRIVER, "wireguard-go", ifname], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env)
        started = self._read()
        assert started.get("started"), started

    @property
    def public(self) -> str:
        return encode_key(public_key(self.key))

    def _read(self) -> dict:
        return json.loads(read_line(self.proc, 60, f"engine driver answer in {self.ns}"))

    def cmd(self, op: str, **kw) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        reply = self._read()
        assert reply["ok"], reply
        return reply

    def apply(self, **config) -> None:
        self.cmd("apply", config={"private_key": encode_key(self.key), **config})

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write(json.dumps({"op": "stop"}) + "\n")
            self.proc.stdin.flush()
            assert self._read().get("stopped")
            self.proc.wait(timeout=15)


@pytest.fixture
def pair():
    a, b = Netns("ea"), Netns("eb")
    sides: list[Side] = []
    try:
        a.create()
        b.create()
        veth(a, b, "192.168.71.1/24", "192.168.71.2/24")
        hub = Side(a, unique("anxea"))
        sides.append(hub)
        node = Side(b, unique("anxeb"))
        sides.append(node)
        hub.apply(listen_port=51820, address="10.71.0.1/24", mtu=1420,
                  peers=[{"public_key": node.public, "allowed_ips": ["10.71.0.2/32"]}])
        node.apply(listen_port=None, address="10.71.0.2/32", mtu=1420, routes=["10.71.0.0/24"],
                   peers=[{"public_key": hub.public, "endpoint": "192.168.71.1:51820",
                           "allowed_ips": ["10.71.0.0/24"], "persistent_keepalive": 25}])
        yield hub, node
    finally:
        for side in sides:
            try:
                side.stop()
            except Exception:
                pass
        a.close()
        b.close()


def _wireguard_go_pids(ifname: str) -> list[int]:
    """PIDs of wireguard-go processes serving ``ifname`` (read from /proc; no procps needed)."""
    from anex_agent.tunnels.engines.cleanup import _read_cmdline, wireguard_go_ifname

    return [int(e) for e in os.listdir("/proc") if e.isdigit() and wireguard_go_ifname(_read_cmdline(int(e))) == ifname]


def _ping(ns: Netns, addr: str, count: int = 1, wait: int = 2) -> bool:
    return ns.run(["ping", "-c", str(count), "-W", str(wait), addr], check=False).returncode == 0


def test_handshake_ping_and_tcp_across_the_tunnel(pair):
    hub, node = pair
    assert _ping(node.ns, "10.71.0.1", count=3), "no ping over the tunnel"
    status = hub.cmd("status")["status"]
    (peer,) = status["peers"]
    assert peer["public_key"] == node.public and peer["last_handshake"] is not None
    assert peer["endpoint"].startswith("192.168.71.2:")  # the hub learnt the node's endpoint
    assert peer["rx_bytes"] > 0 and peer["tx_bytes"] > 0

    # TCP: a real listener in the hub namespace on its mesh address, a client in the node namespace
    server = hub.ns.popen([sys.executable, "-c",
                           "import socket;s=socket.create_server(('10.71.0.1',7070));c,_=s.accept();"
                           "d=b''\nwhile len(d)<100000: d+=c.recv(65536)\nc.sendall(str(len(d)).encode());c.close()"])
    try:
        client = node.ns.run([sys.executable, "-c",
                              "import socket,time\nend=time.monotonic()+20\nwhile True:\n try: s=socket.create_connection(('10.71.0.1',7070),2);break\n"
                              " except OSError:\n  if time.monotonic()>end: raise\n  time.sleep(0.1)\ns.sendall(b'x'*100000);print(s.recv(100).decode())"],
                             timeout=30)
        assert client.stdout.strip() == "100000"
    finally:
        server.wait(timeout=10)


def test_apply_twice_changes_nothing_and_keeps_the_session(pair):
    hub, node = pair
    assert _ping(node.ns, "10.71.0.1")
    before = node.cmd("dump")["dump"]
    node.apply(listen_port=None, address="10.71.0.2/32", mtu=1420, routes=["10.71.0.0/24"],
               peers=[{"public_key": hub.public, "endpoint": "192.168.71.1:51820",
                       "allowed_ips": ["10.71.0.0/24"], "persistent_keepalive": 25}])
    after = node.cmd("dump")["dump"]
    assert after == before  # same config, same random port, same session (handshake time unchanged)
    assert before["peers"][0]["last_handshake"] is not None
    routes = node.ns.check_output(["ip", "route", "show", "dev", node.ifname])
    assert routes.count("10.71.0.0/24") == 1


def test_update_routes_and_remove_a_peer(pair):
    hub, node = pair
    node.apply(listen_port=None, address="10.71.0.2/32", mtu=1400, routes=["10.71.0.0/24", "10.72.0.0/24"],
               peers=[{"public_key": hub.public, "endpoint": "192.168.71.1:51820",
                       "allowed_ips": ["10.71.0.0/24", "10.72.0.0/24"], "persistent_keepalive": 25}])
    routes = node.ns.check_output(["ip", "route", "show", "dev", node.ifname])
    assert "10.72.0.0/24" in routes and f"proto {RTPROT_ANEX}" in routes
    assert "mtu 1400" in node.ns.check_output(["ip", "link", "show", node.ifname])
    assert node.cmd("dump")["dump"]["peers"][0]["allowed_ips"] == ["10.71.0.0/24", "10.72.0.0/24"]

    hub.apply(listen_port=51820, address="10.71.0.1/24", mtu=1420, peers=[])
    assert hub.cmd("dump")["dump"]["peers"] == []
    assert not _ping(node.ns, "10.71.0.1", wait=1)  # the hub no longer accepts the node


def _transport_messages_sent(ns: Netns, table: str) -> tuple[int, int]:
    """(keepalives, data packets) the node sent to the hub since ``table`` was added (see below)."""
    out = ns.check_output(["nft", "-j", "list", "table", "inet", table])
    counters = [expr["counter"]["packets"] for item in json.loads(out)["nftables"] if "rule" in item
                for expr in item["rule"]["expr"] if "counter" in expr]
    assert len(counters) == 2, out
    return counters[0], counters[1]


def _sent_at_least(ns: Netns, table: str, keepalives: int) -> tuple[int, int] | None:
    """The counts once ``keepalives`` keepalives or any data packet went; None before."""
    counts = _transport_messages_sent(ns, table)
    return counts if counts[0] >= keepalives or counts[1] else None


def test_send_keepalive_sends_a_wireguard_keepalive_no_data_and_keeps_the_interval(pair):
    """The path watch's nudge on wireguard-go: a WireGuard keepalive (a transport message of 32
    bytes, no payload), no data packet (data that nothing answers makes WireGuard initiate again
    15 s later, whitepaper §6.5), and the peer's persistent keepalive as it was, with an interval
    and without one. Counted on the wire by type and size; every keepalive the node sends during
    the test is one asked for (the interval is off, or an hour; nothing arrives to answer)."""
    hub, node = pair
    wait_until(lambda: hub.cmd("status")["status"]["peers"][0]["rx_bytes"] > 148, 20,
               "the node's handshake and its first keepalive (an initiation is 148 bytes)")
    peer = {"public_key": hub.public, "endpoint": "192.168.71.1:51820", "allowed_ips": ["10.71.0.0/24"]}

    def configure(interval: int) -> None:
        node.apply(listen_port=None, address="10.71.0.2/32", mtu=1420, routes=["10.71.0.0/24"],
                   peers=[{**peer, "persistent_keepalive": interval}])

    configure(0)  # WireGuard's own keepalives off: the timer armed for 25 s finds 0 and sends nothing
    port = node.cmd("dump")["dump"]["listen_port"]
    table = "anex_test_ka"
    transport = f"udp sport {port} udp dport 51820 @th,64,8 4"
    node.ns.run(["nft", "-f", "-"], input=(
        f"table inet {table} {{\n chain out {{\n  type filter hook output priority 0; policy accept;\n"
        f"  {transport} udp length 40 counter\n  {transport} udp length != 40 counter\n }}\n}}\n"))
    try:
        steps = [(0, "a keepalive asked for, no interval"),
                 (3600, "the keepalive WireGuard sends when the interval is turned on"),
                 (3600, "a keepalive asked for, an interval of an hour")]
        for sent, (interval, what) in enumerate(steps, 1):
            if sent == 2:
                configure(interval)
            else:
                assert node.cmd("keepalive", keys=[hub.public])["sent"] is True
            counts = wait_until(lambda: _sent_at_least(node.ns, table, sent), 10, what)
            assert counts == (sent, 0), f"{what}: (keepalives, data packets) sent: {counts}"  # never data
            assert node.cmd("dump")["dump"]["peers"][0]["persistent_keepalive"] == interval
        assert node.cmd("keepalive", keys=[encode_key(bytes(32))])["sent"] is False  # not a peer: nothing
    finally:
        node.ns.run(["nft", "delete", "table", "inet", table], check=False)


def test_teardown_leaves_nothing(pair):
    hub, node = pair
    assert _ping(node.ns, "10.71.0.1")
    for side in (hub, node):
        side.stop()
        links = side.ns.check_output(["ip", "-o", "link"])
        assert side.ifname not in links
        assert f"proto {RTPROT_ANEX}" not in side.ns.check_output(["ip", "route"])
        assert not os.path.exists(f"/var/run/wireguard/{side.ifname}.sock")
        assert not _wireguard_go_pids(side.ifname), f"wireguard-go for {side.ifname} still running"


def test_cleanup_removes_what_a_crash_left(tmp_path):
    """`anex-agent cleanup` (the real CLI) against real leftovers: an orphaned wireguard-go, a stale socket, our nft table."""
    import socket as socket_mod

    ns = Netns("ec")
    orphan_if = unique("anxec")
    stale = f"/var/run/wireguard/{unique('anxes')}.sock"
    try:
        ns.create()
        env = {**os.environ, "WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD": "1"}
        ns.run(["wireguard-go", orphan_if], env=env)  # without -f it daemonizes: an orphan, as after a crash
        deadline = time.monotonic() + 10
        while orphan_if not in ns.check_output(["ip", "-o", "link"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.makedirs("/var/run/wireguard", exist_ok=True)
        with socket_mod.socket(socket_mod.AF_UNIX, socket_mod.SOCK_STREAM) as sock:
            sock.bind(stale)  # a socket file nobody listens on
        table = "anex_" + unique("c")
        ns.run(["nft", "add", "table", "inet", table])

        out = ns.run([sys.executable, "-m", "anex_agent", "cleanup"], env={**os.environ, "PYTHONPATH": REPO}).stdout
        assert f"({orphan_if})" in out, out
        assert f"removed stale UAPI socket {stale}" in out
        assert f"deleted nftables table inet {table}" in out
        deadline = time.monotonic() + 10
        while orphan_if in ns.check_output(["ip", "-o", "link"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert orphan_if not in ns.check_output(["ip", "-o", "link"])
        assert not os.path.exists(stale)
        assert table not in ns.check_output(["nft", "list", "tables"])
        again = ns.run([sys.executable, "-m", "anex_agent", "cleanup"], env={**os.environ, "PYTHONPATH": REPO}).stdout
        assert orphan_if not in again and table not in again
    finally:
        from anex_agent.tunnels.engines.cleanup import _read_cmdline, wireguard_go_ifname

        for entry in os.listdir("/proc"):  # the daemon we started, by its pid, if the test failed early
            if entry.isdigit() and wireguard_go_ifname(_read_cmdline(int(entry))) == orphan_if:
                os.kill(int(entry), 15)
        if os.path.exists(stale):
            os.unlink(stale)
        ns.close()


def test_sigkilled_owner_takes_wireguard_go_with_it():
    """A crashed agent (SIGKILL) must not leave wireguard-go running: PR_SET_PDEATHSIG ends it, the interface goes."""
    from anex_agent.tunnels.engines.cleanup import _read_cmdline, wireguard_go_ifname

    ns = Netns("ek")
    try:
        ns.create()
        side = Side(ns, unique("anxek"))
        assert side.ifname in ns.check_output(["ip", "-o", "link"])
        side.proc.kill()  # the driver (our engine's owner) dies without any cleanup
        side.proc.wait(timeout=10)

        def wireguard_go_alive() -> bool:
            return any(entry.isdigit() and wireguard_go_ifname(_read_cmdline(int(entry))) == side.ifname
                       for entry in os.listdir("/proc"))

        deadline = time.monotonic() + 10
        while (wireguard_go_alive() or side.ifname in ns.check_output(["ip", "-o", "link"])) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not wireguard_go_alive()
        assert side.ifname not in ns.check_output(["ip", "-o", "link"])
    finally:
        ns.close()
