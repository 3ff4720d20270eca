"""``anex-agent gateway`` as users run it, against a real ``anex-agent coordinator``, in one namespace.

Checks what only the whole process shows: registration, peers following the watch
stream (join -> peer appears, delete -> peer goes), fail static (coordinator stopped:
peers stay; gateway restarted while the coordinator is down: starts from its saved
state), and a clean exit on SIGTERM (no interface, nft table, socket; sysctl restored).
The hub's peers are read with ``wg show`` (wireguard-tools speaks UAPI too), its metrics with curl.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from anex_agent.client.rest import proven_body
from anex_agent.gateway.settings import interface_for
from anex_agent.wire.keys import KeyPair, encode_key, generate_private_key, load_or_create, public_key
from anex_agent.wire.nodes import NodeJoinRequest
from integration.netns import Netns, missing_prerequisites, unique
from tests.polling import wait_for

REASON = missing_prerequisites("wireguard-go", "nft", "wg")
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

PORT = 8711
URL = f"http://127.0.0.1:{PORT}"
ADMIN = "admin-" + unique("") + unique("") + unique("")
METRICS = "127.0.0.1:9109"


def _argv(*args: str) -> list[str]:
    script = Path(sys.executable).with_name("anex-agent")
    return [str(script), *args] if script.exists() else [sys.executable, "-m", "anex_agent", *args]


class Rig:
    def __init__(self, ns: Netns, workdir: Path) -> None:
        self.ns, self.workdir = ns, workdir
        self.coordinator: subprocess.Popen | None = None
        self.gateway: subprocess.Popen | None = None
        self.token: str | None = None

    def log(self, name: str):
        return open(self.workdir / f"{name}.log", "ab")

    def start_coordinator(self, *extra: str) -> None:
        env = {**os.environ, "ANEX_ADMIN_TOKEN": ADMIN}
        self.coordinator = self.ns.popen(_argv("coordinator", "--listen", f"127.0.0.1:{PORT}",
                                               "--state-dir", str(self.workdir / "coord"), *extra),
                                         stdout=self.log("coordinator"), stderr=subprocess.STDOUT, env=env)
        wait_for(lambda: self.call("GET", "/v1/nodes", ok_only=True), 30, "coordinator up")

    def stop(self, proc: subprocess.Popen | None) -> int | None:
        if proc is None or proc.poll() is not None:
            return proc.returncode if proc else None
        proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout=20)

    def call(self, method: str, path: str, body: dict | None = None, token: str = ADMIN, ok_only: bool = False):
        code = ("import json,sys,urllib.request,urllib.error\nm,u,t,b=sys.argv[1:5]\n"
                "req=urllib.request.Request(u,method=m,data=b.encode() or None,headers={'Authorization':'Bearer '+t,"
                "'Content-Type':'application/json'})\n"
                "try:\n r=urllib.request.urlopen(req,timeout=5);print(r.status);print(r.read().decode())\n"
                "except urllib.error.HTTPError as e: print(e.code);print(e.read().decode())\n"
                "except OSError as e: print(0);print(e)\n")
        out = self.ns.run([sys.executable, "-c", code, method, URL + path, token, json.dumps(body) if body else ""],
                          check=False, timeout=20).stdout
        status, _, text = out.partition("\n")
        status = int(status or 0)
        if ok_only:
            return 200 <= status < 300
        assert 200 <= status < 300, f"{method} {path}: {status} {text}"
        return json.loads(text) if text.strip() else None

    def start_gateway(self) -> None:
        self.gateway = self.ns.popen(_argv("gateway", "--coordinator", URL, "--token", self.token or "",
                                           "--state-dir", str(self.workdir / "gw"), "--listen-udp", "0.0.0.0:51820",
                                           "--endpoint", "192.0.2.1:51820", "--route", "172.29.0.0/24",
                                           "--dns-upstream", "127.0.0.1:5353", "--metrics-listen", METRICS),
                                     stdout=self.log("gateway"), stderr=subprocess.STDOUT)

    def metrics(self) -> str:
        """``GET /metrics`` of the gateway, with curl as a scraper would (empty when not served yet)."""
        out = self.ns.run(["curl", "-sS", "--max-time", "5", f"http://{METRICS}/metrics"], check=False)
        return out.stdout if out.returncode == 0 else ""

    def gateway_ifname(self) -> str | None:
        links = self.ns.check_output(["ip", "-o", "link"])
        names = [l.split(":")[1].strip() for l in links.splitlines() if ": anxgw" in l]
        return names[0] if names else None

    def hub_peers(self, ifname: str) -> set[str]:
        out = self.ns.run(["wg", "show", ifname, "peers"], check=False)
        return set(out.stdout.split()) if out.returncode == 0 else set()

    def join(self, key: bytes, name: str) -> str:
        token = self.call("POST", "/v1/join-tokens", {"kind": "node"})["token"]
        coordinator_key = self.call("GET", "/v1/coordinator")["public_key"]
        body = proven_body(NodeJoinRequest, {"token": token, "name": name, "provider": "other"}, KeyPair(key),
                           coordinator_key)
        joined = self.call("POST", "/v1/nodes", body)
        return joined["node_id"]

    def tail(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""


@pytest.fixture
def rig(tmp_path):
    ns = Netns("gp").create()
    r = Rig(ns, tmp_path)
    try:
        r.start_coordinator()
        r.token = r.call("POST", "/v1/join-tokens", {"kind": "gateway", "reusable": True})["token"]
        yield r
    finally:
        r.stop(r.gateway)
        r.stop(r.coordinator)
        ns.close()


def test_gateway_follows_the_coordinator_and_exits_clean(rig):
    assert rig.ns.check_output(["cat", "/proc/sys/net/ipv4/ip_forward"]).strip() == "0"
    rig.start_gateway()
    ifname = wait_for(rig.gateway_ifname, 30, "gateway interface")
    wait_for(lambda: rig.call("GET", "/v1/gateways")["gateways"], 30, "gateway registered")
    wait_for(lambda: "10.254." in rig.ns.check_output(["ip", "-o", "-4", "addr", "show", ifname]), 10, "mesh address")
    assert rig.ns.check_output(["cat", "/proc/sys/net/ipv4/ip_forward"]).strip() == "1"
    tables = rig.ns.check_output(["nft", "list", "tables"])
    assert "anex_gw_" in tables, rig.tail("gateway")

    # a node joins: its key shows up on the hub through the watch stream
    k1 = generate_private_key()
    started = time.monotonic()
    node1 = rig.join(k1, "n1")
    wait_for(lambda: encode_key(public_key(k1)) in rig.hub_peers(ifname), 10, "joined node as hub peer")
    print(f"join -> hub peer: {time.monotonic() - started:.3f} s")
    metrics = wait_for(lambda: (text := rig.metrics()) and 'changes_total{type="peer_added"} 1.0' in text and text,
                       10, "the join counted on /metrics")
    assert "anex_gateway_peers 1.0" in metrics and "anex_gateway_watch_connected 1.0" in metrics, metrics

    # deleted: it goes
    rig.call("DELETE", f"/v1/nodes/{node1}")
    wait_for(lambda: encode_key(public_key(k1)) not in rig.hub_peers(ifname), 10, "deleted node removed from hub")

    # fail static: coordinator down, the peers stay and the gateway keeps running
    k2 = generate_private_key()
    rig.join(k2, "n2")
    wait_for(lambda: encode_key(public_key(k2)) in rig.hub_peers(ifname), 10, "second node as hub peer")
    rig.stop(rig.coordinator)
    time.sleep(1.5)  # let the watch stream notice and retry at least once
    assert rig.gateway.poll() is None, rig.tail("gateway")
    assert rig.hub_peers(ifname) == {encode_key(public_key(k2))}

    # restart the gateway while the coordinator is down: it starts from its saved state
    assert rig.stop(rig.gateway) == 0, rig.tail("gateway")
    wait_for(lambda: rig.gateway_ifname() is None, 10, "interface gone after SIGTERM")
    rig.start_gateway()
    ifname2 = wait_for(rig.gateway_ifname, 30, "gateway interface after restart")
    assert ifname2 == ifname  # the name follows the key: the restart replaces, never duplicates
    wait_for(lambda: rig.hub_peers(ifname) == {encode_key(public_key(k2))}, 15, "saved peers restored")

    # clean exit: nothing of ours left, sysctl as found
    assert rig.stop(rig.gateway) == 0, rig.tail("gateway")
    assert rig.gateway_ifname() is None
    assert "anex_gw_" not in rig.ns.check_output(["nft", "list", "tables"])
    assert rig.ns.check_output(["cat", "/proc/sys/net/ipv4/ip_forward"]).strip() == "0"
    assert not os.path.exists(f"/var/run/wireguard/{ifname}.sock")
    key_file = rig.workdir / "gw" / "private.key"
    assert key_file.stat().st_mode & 0o777 == 0o600


def test_an_expired_node_leaves_the_hub(rig):
    """A node that never heartbeats expires and its peer leaves the running gateway's hub."""
    rig.stop(rig.coordinator)
    rig.start_coordinator("--heartbeat-interval", "1", "--not-ready-after", "2", "--expired-after", "4")
    rig.start_gateway()
    ifname = wait_for(rig.gateway_ifname, 30, "gateway interface")
    key = generate_private_key()
    node = rig.join(key, "silent")
    wait_for(lambda: encode_key(public_key(key)) in rig.hub_peers(ifname), 10, "joined node as hub peer")
    started = time.monotonic()
    wait_for(lambda: encode_key(public_key(key)) not in rig.hub_peers(ifname), 15, "expired node removed from hub")
    print(f"join -> expired and off the hub: {time.monotonic() - started:.1f} s")
    assert node not in {n["id"] for n in rig.call("GET", "/v1/nodes")["nodes"]}
    assert rig.stop(rig.gateway) == 0, rig.tail("gateway")


def test_a_refused_registration_ends_the_start_and_leaves_nothing(rig):
    """The engine starts while the coordinator answers the registration: a refused token
    ends the start with one clear line, and the engine started meanwhile is gone again."""
    rig.token = "anexgt_" + unique("") + "x" * 40  # no gateway token the coordinator issued
    rig.start_gateway()
    assert rig.gateway.wait(timeout=30) != 0
    log = rig.tail("gateway")
    assert "--token: the coordinator refused this join token: not valid" in log and "Traceback" not in log, log
    assert rig.gateway_ifname() is None, rig.ns.check_output(["ip", "-o", "link"])
    # this gateway's engine (its name follows the key in its state dir): no process, no socket
    ifname = interface_for(load_or_create(rig.workdir / "gw" / "private.key").public_b64)
    assert subprocess.run(["pgrep", "-f", f"wireguard-go -f {ifname}"], capture_output=True).returncode == 1
    assert not os.path.exists(f"/var/run/wireguard/{ifname}.sock")
    assert "anex_gw_" not in rig.ns.check_output(["nft", "list", "tables"])
