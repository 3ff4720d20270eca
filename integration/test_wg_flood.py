"""A flood of valid-mac1 handshake initiations against our user-space engine does not keep a real
peer out: wireguard-go (the real node) still completes its handshake through the cookie reply and
passes data, while the engine's answers to the flood stay within its budgets.

    ns "wgg": wireguard-go 10.99.0.1/24, UDP 51820, veth 192.168.77.1/24 (+ the flood's 192.168.77.11-14)
    ns "wgu": python -m integration.wg_peer 10.99.0.2, UDP 51821, veth 192.168.77.2/24
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from integration.netns import Netns, read_line
from integration.test_wg_interop import OUR_TUN, OUR_UDP, REASON, REPO, Setup
from tests.polling import wait_for

pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

FLOOD_SOURCES = [f"192.168.77.{n}" for n in range(11, 15)]
#: The flood's rate and length: long enough to cover a cookie round and wireguard-go's retry (5 s).
FLOOD_RATE = float(os.environ.get("ANEX_WG_FLOOD_RATE", "5000"))
FLOOD_SECONDS = float(os.environ.get("ANEX_WG_FLOOD_SECONDS", "25"))


def start_flood(ns: Netns, public_b64: str, *, rate: float = FLOOD_RATE, seconds: float = FLOOD_SECONDS,
                sources: list[str] = FLOOD_SOURCES) -> subprocess.Popen:
    """integration/wg_flood.py in ``ns`` against our engine's UDP port (its JSON line comes at the end)."""
    return ns.popen([sys.executable, "-m", "integration.wg_flood", public_b64, f"{OUR_UDP[0]}:{OUR_UDP[1]}",
                     "--sources", ",".join(sources), "--rate", str(rate), "--seconds", str(seconds)],
                    cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.PIPE, text=True)


@pytest.fixture
def setup(tmp_path):
    with Netns("wgg") as go, Netns("wgu") as ours:
        s = Setup(go, ours, tmp_path, psk=None)
        link = go.check_output(["ip", "-o", "link", "show", "type", "veth"]).split(":")[1].strip().split("@")[0]
        for address in FLOOD_SOURCES:
            go.run(["ip", "addr", "add", f"{address}/24", "dev", link])
        try:
            yield s
        finally:
            try:
                s.peer.call(op="stop")
            except Exception:
                pass


def test_a_real_node_gets_through_a_valid_mac1_flood(setup):
    s = setup
    s.configure_ours(peer_public=s.go_key.public_b64)
    flood = start_flood(s.go, s.our_key.public_b64)
    assert json.loads(read_line(flood, 60, "the flood's start"))["started"]
    wait_for(lambda: s.peer.status()["events"].get("cookie-sent", 0) > 0, 60, "the flood to reach the engine")
    s.configure_go(peer_public=s.our_key.public_b64)  # the real node initiates into the flood
    result = s.go.run(["ping", "-c", "1", "-w", "60", OUR_TUN], check=False, timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr
    ping = s.go.run(["ping", "-c", "5", "-i", "0.2", "-W", "5", OUR_TUN], check=False, timeout=60)
    assert " 0 received" not in ping.stdout, ping.stdout  # data passes while the flood goes on
    status = s.peer.status()
    events, drops = status["events"], status["drops"]
    assert events.get("handshake-responded", 0) >= 1
    done = json.loads(read_line(flood, FLOOD_SECONDS + 60, "the flood's count"))
    assert flood.poll() is not None or flood.wait(timeout=30) == 0
    status = s.peer.status()
    events, drops = status["events"], status["drops"]
    # the engine answered a small share of the flood (per-source and total budgets), not each message
    assert events.get("cookie-sent", 0) < done["sent"] / 10, (events, done)
    assert drops.get("under load: handshake rate limit for this source exceeded", 0) > 0, drops
