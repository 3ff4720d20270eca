"""Remote access: how long ``anex-agent ssh NODE -- true`` takes, and SFTP throughput over the mesh
against raw TCP over the same mesh path, in one run.

Needs root, wireguard-go, nftables and the OpenSSH client. Builds the demo mesh
(:mod:`anex_agent.testing.mesh`): one node (``anex-agent daemon``, wireguard-go engine) and the
cluster namespace behind the gateway. From the cluster namespace, as an operator would:

* ``ssh_true``: wall time of ``anex-agent ssh NODE -- true`` until it exits (a fresh key, a
  certificate from the coordinator, connect, host certificate check, run, exit status), runs
  with the median;
* ``sftp``: OpenSSH's ``sftp`` downloads a file of ``--size`` MiB (default 256) from the node;
* ``raw_tcp``: the same number of bytes from a plain TCP source on the node's mesh address
  (:mod:`anex_agent.testing.services` ``source``), same path, same direction;

rounds interleaved; medians reported with ``sftp / raw_tcp``. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from anex_agent.testing.mesh import CLUSTER_GW, COORDINATOR_PORT, Mesh, anex_argv  # noqa: E402
from anex_agent.testing.netlab import missing_prerequisites  # noqa: E402

SOURCE_PORT = 9101
MIB = 1 << 20

_RAW = """
import socket, struct, sys, time
host, port, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.create_connection((host, port), timeout=30)
start = time.perf_counter()
s.sendall(struct.pack(">Q", size))
got = 0
buf = bytearray(1 << 20)
while got < size:
    n = s.recv_into(buf)
    if not n:
        break
    got += n
print(got, time.perf_counter() - start)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=256, help="MiB per transfer (default 256)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ssh-runs", type=int, default=5)
    args = parser.parse_args()
    reason = missing_prerequisites("wireguard-go", "nft") or (None if shutil.which("sftp") else "no sftp client")
    if reason:
        print(json.dumps({"skipped": reason}))
        return 0
    size = args.size * MIB
    with tempfile.TemporaryDirectory(prefix="anex-bench-ssh-") as tmp, Mesh(Path(tmp) / "mesh") as mesh:
        work = Path(tmp)
        mesh.build_network()
        mesh.start_coordinator()
        mesh.start_gateway()
        node = mesh.add_node_namespace()
        mesh.start_agent(node, mesh.agent_env(node, ANEX_NODE_NAME="bench-ssh"))
        status = node.status()
        node_id, address = status["node_id"], status["address"]
        deadline = time.monotonic() + 30
        while "SSH: host certificate" not in node.log() and time.monotonic() < deadline:
            time.sleep(0.2)
        source = node.ns.popen([sys.executable, "-m", "anex_agent.testing.services", "source", "--listen",
                                f"0.0.0.0:{SOURCE_PORT}"], stdout=subprocess.PIPE, text=True)
        source.stdout.readline()
        remote = f"/tmp/anex-bench-ssh-{os.getpid()}.bin"
        node.ns.run(["sh", "-c", f"head -c {size} /dev/urandom > {remote}"], timeout=120)
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("ANEX_")},
               "ANEX_COORDINATOR_URL": f"http://{CLUSTER_GW}:{COORDINATOR_PORT}", "ANEX_ADMIN_TOKEN": mesh.admin_token}

        ssh_true = []
        for _ in range(args.ssh_runs):
            start = time.perf_counter()
            done = mesh.cluster.run([*anex_argv(), "ssh", node_id, "--", "true"], env=env, check=False, timeout=60,
                                    stdin=subprocess.DEVNULL)
            ssh_true.append(time.perf_counter() - start)
            if done.returncode != 0:
                raise SystemExit(f"anex-agent ssh failed: {done.stderr[-500:]}")

        key = work / "id"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        cert = mesh.admin("POST", f"/v1/nodes/{node_id}/ssh-certificates",
                          {"public_key": Path(f"{key}.pub").read_text().strip(), "validity": 3600,
                           "requested_for": "bench"})
        Path(f"{key}-cert.pub").write_text(cert["certificate"] + "\n")
        (work / "known_hosts").write_text("".join(line + "\n" for line in cert["known_hosts"]))
        batch = work / "batch"
        batch.write_text(f"get {remote} {work / 'down.bin'}\n")
        sftp_argv = ["sftp", "-F", "/dev/null", "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                     "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={work / 'known_hosts'}",
                     "-P", str(cert["port"]), "-b", str(batch), f"{node_id}@{address}"]
        sftp, raw = [], []
        for _ in range(args.rounds):
            out = mesh.cluster.run([sys.executable, "-c", _RAW, address, str(SOURCE_PORT), str(size)], timeout=300)
            got, seconds = out.stdout.split()
            assert int(got) == size, out.stdout
            raw.append(size / MIB / float(seconds))
            start = time.perf_counter()
            mesh.cluster.run(sftp_argv, timeout=600)
            sftp.append(size / MIB / (time.perf_counter() - start))
            assert (work / "down.bin").stat().st_size == size
            (work / "down.bin").unlink()
        source.terminate()
        node.ns.run(["rm", "-f", remote])
    result = {
        "engine": "wireguard-go",
        "ssh_true_seconds": {"median": round(statistics.median(ssh_true), 3), "runs": [round(t, 3) for t in ssh_true]},
        "size_mib": args.size,
        "sftp_mib_per_s": {"median": round(statistics.median(sftp), 1), "runs": [round(x, 1) for x in sftp]},
        "raw_tcp_mib_per_s": {"median": round(statistics.median(raw), 1), "runs": [round(x, 1) for x in raw]},
    }
    result["sftp_over_raw_tcp"] = round(result["sftp_mib_per_s"]["median"] / result["raw_tcp_mib_per_s"]["median"], 3)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
