"""Interop: our user-space WireGuard (integration/wg_peer.py, the real UserspaceEngine over a UDP
socket with a minimal ICMP/UDP layer) against Debian's wireguard-go with a TUN interface,
in two network namespaces joined by a veth pair.

    ns "wgg": wireguard-go IF 10.99.0.1/24, UDP 51820, veth 192.168.77.1/24
    ns "wgu": python -m integration.wg_peer 10.99.0.2, UDP 51821, veth 192.168.77.2/24
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from anex_agent.wire import keys
from integration.netns import Netns, missing_prerequisites, read_line, unique, veth
from tests.polling import wait_for

REASON = missing_prerequisites("wireguard-go", "wg", "ping")
if REASON is None and not os.path.exists("/dev/net/tun"):
    REASON = "needs /dev/net/tun for wireguard-go"
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

REPO = Path(__file__).resolve().parents[1]
GO_TUN, OUR_TUN = "10.99.0.1", "10.99.0.2"
GO_UDP, OUR_UDP = ("192.168.77.1", 51820), ("192.168.77.2", 51821)


class OurPeer:
    """The wg_peer.py process inside a namespace, spoken to over its stdin/stdout line protocol."""

    def __init__(self, ns: Netns) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.proc = ns.popen([sys.executable, "-m", "integration.wg_peer", OUR_TUN], cwd=REPO, env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def call(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        doc = json.loads(read_line(self.proc, 30, f"wg_peer answer to {cmd.get('op')}"))
        assert doc.get("ok"), doc
        return doc

    def status(self) -> dict:
        return self.call(op="status")

    def last_handshake(self) -> float | None:
        peers = self.status()["status"]["peers"]
        return peers[0]["last_handshake"] if peers else None


class Setup:
    def __init__(self, go: Netns, ours: Netns, tmp: Path, *, psk: bytes | None) -> None:
        self.go, self.ours, self.tmp = go, ours, tmp
        self.go_key, self.our_key = keys.KeyPair(keys.generate_private_key()), keys.KeyPair(keys.generate_private_key())
        self.psk = psk
        self.ifname = unique("anxwg")
        veth(go, ours, f"{GO_UDP[0]}/24", f"{OUR_UDP[0]}/24")
        env = dict(os.environ, WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD="1")
        self.wggo = go.popen(["wireguard-go", "-f", self.ifname], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: go.run(["wg", "show", self.ifname], check=False).returncode == 0, what="wireguard-go up")
        self.peer = OurPeer(ours)

    def configure_go(self, *, peer_public: str, endpoint: bool = True) -> None:
        key_file = self.tmp / "go.key"
        key_file.write_text(self.go_key.private_b64 + "\n")
        key_file.chmod(0o600)
        cmd = ["wg", "set", self.ifname, "private-key", str(key_file), "listen-port", str(GO_UDP[1]),
               "peer", peer_public, "allowed-ips", f"{OUR_TUN}/32"]
        if endpoint:
            cmd += ["endpoint", f"{OUR_UDP[0]}:{OUR_UDP[1]}"]
        if self.psk:
            psk_file = self.tmp / "psk"
            psk_file.write_text(base64.b64encode(self.psk).decode() + "\n")
            psk_file.chmod(0o600)
            cmd += ["preshared-key", str(psk_file)]
        self.go.run(cmd)
        self.go.run(["ip", "addr", "add", f"{GO_TUN}/24", "dev", self.ifname])
        self.go.run(["ip", "link", "set", self.ifname, "up"])

    def configure_ours(self, *, peer_public: str) -> None:
        self.peer.call(op="apply", config={
            "private_key": self.our_key.private_b64, "listen_port": OUR_UDP[1], "address": f"{OUR_TUN}/24",
            "peers": [{"public_key": peer_public, "endpoint": f"{GO_UDP[0]}:{GO_UDP[1]}",
                       "allowed_ips": [f"{GO_TUN}/32"],
                       "preshared_key": base64.b64encode(self.psk).decode() if self.psk else None}],
        })

    def go_latest_handshake(self) -> int:
        out = self.go.check_output(["wg", "show", self.ifname, "latest-handshakes"]).split()
        return int(out[1]) if len(out) >= 2 else 0

    def ping(self, count: int = 3) -> subprocess.CompletedProcess:
        return self.go.run(["ping", "-c", str(count), "-i", "0.2", "-W", "2", OUR_TUN], check=False)


@pytest.fixture(params=[False, True], ids=["no-psk", "psk"])
def setup(request, tmp_path):
    with Netns("wgg") as go, Netns("wgu") as ours:
        s = Setup(go, ours, tmp_path, psk=os.urandom(32) if request.param else None)
        try:
            yield s
        finally:
            try:
                s.peer.call(op="stop")
            except Exception:
                pass


def test_we_initiate_then_ping_and_udp_both_ways(setup):
    s = setup
    s.configure_go(peer_public=s.our_key.public_b64)
    s.configure_ours(peer_public=s.go_key.public_b64)
    s.peer.call(op="initiate", peer=s.go_key.public_b64)
    wait_for(s.peer.last_handshake, what="handshake with us as initiator")
    assert s.peer.status()["events"].get("handshake-initiated", 0) >= 1
    assert s.go_latest_handshake() > 0

    result = s.ping()
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0% packet loss" in result.stdout
    big = s.go.run(["ping", "-c", "2", "-s", "1372", "-W", "2", OUR_TUN], check=False)  # 1400-byte packets
    assert big.returncode == 0, big.stdout

    # UDP from the wireguard-go side to us ...
    s.go.run(["python3", "-c", "import socket,sys; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM);"
              f"s.sendto(b'from-go', ('{OUR_TUN}', 9999))"])
    wait_for(lambda: any(u[3] == b"from-go".hex() and u[2] == 9999 for u in s.peer.status()["udp"]),
             what="UDP datagram from wireguard-go side")
    # ... and from us to a UDP socket on the wireguard-go side (answered by our UDP echo on port 7).
    listener = s.go.popen(["python3", "-c",
        "import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('0.0.0.0', 5555)); print('ready', flush=True);"
        f"s.settimeout(10); d,a=s.recvfrom(2000); print(d.decode(), flush=True); s.sendto(b'echo-me', ('{OUR_TUN}', 7));"
        "d,a=s.recvfrom(2000); print(d.decode(), a[1], flush=True)"], stdout=subprocess.PIPE, text=True)
    assert read_line(listener, 15, "UDP listener ready").strip() == "ready"  # bound before we send (no fixed sleep)
    s.peer.call(op="send_udp", dst=GO_TUN, sport=4444, dport=5555, data=b"from-us".hex())
    out, _ = listener.communicate(timeout=15)
    assert out.split("\n")[:2] == ["from-us", "echo-me 7"], out


def test_they_initiate_and_ping_gets_replies(setup):
    s = setup
    s.configure_ours(peer_public=s.go_key.public_b64)
    s.configure_go(peer_public=s.our_key.public_b64)
    result = s.ping(count=4)
    assert result.returncode == 0, result.stdout + result.stderr
    status = s.peer.status()
    assert status["events"].get("handshake-responded", 0) >= 1
    assert status["events"].get("handshake-initiated", 0) == 0
    assert status["status"]["peers"][0]["last_handshake"] is not None


def test_rekey_after_forced_expiry_keeps_traffic_flowing(setup):
    s = setup
    s.configure_go(peer_public=s.our_key.public_b64)
    s.configure_ours(peer_public=s.go_key.public_b64)
    s.peer.call(op="initiate", peer=s.go_key.public_b64)
    wait_for(s.peer.last_handshake, what="first handshake")
    first = s.peer.status()["events"].get("handshake-complete", 0)
    assert s.ping(2).returncode == 0
    s.peer.call(op="expire", peer=s.go_key.public_b64)
    # The next packet we send finds no usable session: it is staged, a new handshake runs, then it goes out.
    listener = s.go.popen(["python3", "-c",
        "import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('0.0.0.0', 5556));"
        "print('ready', flush=True); s.settimeout(15); d,a=s.recvfrom(2000); print(d.decode(), flush=True)"],
        stdout=subprocess.PIPE, text=True)
    assert read_line(listener, 15, "UDP listener ready").strip() == "ready"  # bound before we send (no fixed sleep)
    s.peer.call(op="send_udp", dst=GO_TUN, sport=4445, dport=5556, data=b"after-rekey".hex())
    out, _ = listener.communicate(timeout=20)
    assert out.strip() == "after-rekey"
    wait_for(lambda: s.peer.status()["events"].get("handshake-complete", 0) > first, what="second handshake")
    result = s.ping(3)
    assert result.returncode == 0 and " 0% packet loss" in result.stdout, result.stdout


def test_wrong_key_never_completes_a_handshake(setup):
    s = setup
    wrong = keys.KeyPair(keys.generate_private_key())
    s.configure_go(peer_public=s.our_key.public_b64)
    s.configure_ours(peer_public=wrong.public_b64)  # we believe the other side has another key
    s.peer.call(op="initiate", peer=wrong.public_b64)
    result = s.ping(count=3)  # wireguard-go initiates too: its initiation names a key we do not know
    assert result.returncode != 0
    time.sleep(1.0)
    status = s.peer.status()
    assert status["status"]["peers"][0]["last_handshake"] is None
    assert status["events"].get("handshake-complete", 0) == 0
    assert status["events"].get("dropped", 0) >= 1  # their initiations were refused
    assert s.go_latest_handshake() == 0


def test_under_load_our_cookie_reply_is_understood_by_wireguard_go(setup):
    """We answer wireguard-go's first initiation with a cookie reply (XChaCha20-Poly1305); its retry
    carries a mac2 made with that cookie, which we accept: the handshake completes."""
    s = setup
    s.configure_ours(peer_public=s.go_key.public_b64)
    s.peer.call(op="under_load", value=True)
    s.configure_go(peer_public=s.our_key.public_b64)
    result = s.go.run(["ping", "-c", "1", "-w", "20", OUR_TUN], check=False, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    events = s.peer.status()["events"]
    assert events.get("cookie-sent", 0) >= 1 and events.get("handshake-responded", 0) >= 1
