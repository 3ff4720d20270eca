"""Loss and distance on the path of an unprivileged node: the delay-and-loss relay
(``tools/lossy-relay``, :mod:`integration.lossy`) between the node and the gateway first drops
2 % of the datagrams each way and reorders 5 %, then holds each datagram 75 ms each way (a
150 ms round trip, where buffers must grow with the bandwidth-delay product); transfers through
a GW_TUNNEL forward (our TCP on the node, Linux TCP in the cluster) arrive whole, checked by
sha256. Completion and integrity are asserted, never a duration.

``ANEX_LOSS_TEST_MB`` sets the size each way through loss (default 100), ``ANEX_DELAY_TEST_MB``
through the long path (default 24)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from anex_agent.testing.mesh import CLUSTER_IP, UNDERLAY_GW, WG_PORT
from integration.lossy import insert_relay, relay_binary, remove_relay
from integration.netns import read_line

HERE = Path(__file__).resolve().parent
SHA_PORT = 9100
TUNNEL = 18200
MB = int(os.environ.get("ANEX_LOSS_TEST_MB", "100"))
DELAY_MB = int(os.environ.get("ANEX_DELAY_TEST_MB", "24"))

CLIENT = (
    "import hashlib,random,socket,sys,time\n"
    "port,mode,n=int(sys.argv[1]),sys.argv[2],int(sys.argv[3])\n"
    "s=socket.create_connection(('127.0.0.1',port),timeout=120)\n"
    "t=time.monotonic();h=hashlib.sha256()\n"
    "if mode=='down':\n"
    "    s.sendall(f'down {n} 7\\n'.encode());got=0\n"
    "    while True:\n"
    "        d=s.recv(1<<16)\n"
    "        if not d: break\n"
    "        h.update(d);got+=len(d)\n"
    "    print(got,h.hexdigest(),time.monotonic()-t)\n"
    "else:\n"
    "    s.sendall(b'up\\n');rng=random.Random(11);left=n\n"
    "    while left:\n"
    "        c=rng.randbytes(min(1<<16,left));h.update(c);s.sendall(c);left-=len(c)\n"
    "    s.shutdown(socket.SHUT_WR);answer=b''\n"
    "    while d:=s.recv(100): answer+=d\n"
    "    print(n,h.hexdigest(),answer.decode(),time.monotonic()-t)\n"
)


def expected_down(n: int, seed: int = 7) -> str:
    sys.path.insert(0, str(HERE))
    from sha_service import stream

    digest = hashlib.sha256()
    for chunk in stream(n, seed):
        digest.update(chunk)
    return digest.hexdigest()


@pytest.fixture(scope="module")
def lossy_node(mesh):
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    if relay_binary() is None:
        pytest.skip("no C compiler to build tools/lossy-relay (install gcc)")
    service = mesh.cluster.popen([sys.executable, str(HERE / "sha_service.py"), f"{CLUSTER_IP}:{SHA_PORT}"],
                                 stdout=subprocess.PIPE, text=True)
    assert read_line(service, 30, "sha service ready").strip() == "ready"
    n = mesh.add_node_namespace()
    # the agent's WireGuard datagrams to the gateway go through the relay
    relay = {"now": insert_relay(n, UNDERLAY_GW, WG_PORT, loss=0.02, reorder=0.05, delay_ms=1, seed=7)}
    env = mesh.agent_env(n, ANEX_ENGINE="auto", **{f"GW_TUNNEL_{TUNNEL}": f"{CLUSTER_IP}:{SHA_PORT}"})
    mesh.start_agent(n, env, unprivileged=True, wait_ready=False)
    mesh.wait_agent_ready(n, timeout=90)
    yield n, relay
    mesh.stop_agent(n)
    remove_relay(n, relay["now"])
    service.terminate()


def both_ways(node, n: int) -> tuple[list[str], list[str]]:
    down = node.ns.run([sys.executable, "-c", CLIENT, str(TUNNEL), "down", str(n)], timeout=900).stdout.split()
    assert int(down[0]) == n and down[1] == expected_down(n), down
    up = node.ns.run([sys.executable, "-c", CLIENT, str(TUNNEL), "up", str(n)], timeout=900).stdout.split()
    assert int(up[0]) == n and up[1] == up[2], up
    return down, up


def test_transfers_survive_2_percent_loss_and_reordering_both_ways(lossy_node):
    node, relay = lossy_node
    assert node.status()["engine"] == "userspace"
    n = MB * 1_000_000
    down, up = both_ways(node, n)
    counts = remove_relay(node, relay["now"])
    relay["now"] = insert_relay(node, UNDERLAY_GW, WG_PORT)  # a clean path again (the next test shapes its own)
    print(f"{MB} MB each way through 2 % loss: down {float(down[2]):.1f} s ({n / float(down[2]) / 1e6:.1f} MB/s), "
          f"up {float(up[3]):.1f} s ({n / float(up[3]) / 1e6:.1f} MB/s); relay {counts}")
    assert counts["dropped"] > 0.01 * (counts["dropped"] + counts["forwarded"])  # the loss was real
    assert counts["reordered"] > 0


def test_transfers_fill_a_150_ms_round_trip_both_ways(lossy_node):
    node, relay = lossy_node
    remove_relay(node, relay["now"])
    relay["now"] = insert_relay(node, UNDERLAY_GW, WG_PORT, delay_ms=75, jitter_ms=1, seed=9)
    n = DELAY_MB * 1_000_000
    down, up = both_ways(node, n)
    counts = remove_relay(node, relay["now"])
    relay["now"] = insert_relay(node, UNDERLAY_GW, WG_PORT)
    print(f"{DELAY_MB} MB each way over a 150 ms round trip: down {n / float(down[2]) / 1e6:.1f} MB/s, "
          f"up {n / float(up[3]) / 1e6:.1f} MB/s; relay {counts}")
    assert counts["forwarded"] > n // 1500  # the transfers went through the delaying relay
