"""A whole mesh on one machine, in network namespaces: the demo's and the integration tests' harness.

Topology (every namespace and link name carries a random suffix)::

    cluster ns  10.77.0.2  ── veth ──  10.77.0.1  gateway ns  bridge 192.168.100.1 ── veth ── 192.168.100.<n+1>  node-<n> ns
      HTTP echo :8080, :8081                         coordinator :8700 (REST + watch)                anex-agent run/daemon
      DNS :53 (echo.default.svc.cluster.local)       anex-agent gateway (wireguard-go hub :51820,  (wireguard-go engine)
      bulk source :9001, sink :9000                  --route 10.77.0.0/24, DNS for the mesh)
      route 10.254.0.0/16 via 10.77.0.1

The coordinator, the gateway and the agents are real processes started with the CLI users
run (``anex-agent coordinator|gateway|run|daemon``), each inside its namespace through
``ip netns exec``; their output goes to ``<workdir>/<name>.log``. An agent started with
``unprivileged=True`` runs as ``nobody`` with no capabilities at all (``setpriv``), as in a
rented container without NET_ADMIN or a TUN device: ``auto`` gives it the built-in engine. :meth:`Mesh.close`
stops every process and deletes every namespace (and with it every link), also after a
failure.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from anex_agent import parse
from anex_agent.errors import AnexError
from anex_agent.testing.netlab import Namespace, bridge, link, stop_processes

#: An unprivileged agent: user and group nobody, no supplementary groups, no capabilities (none
#: inheritable, none in the bounding set), so it can neither open /dev/net/tun nor configure links.
UNPRIVILEGED_UID = 65534
UNPRIVILEGED = ("setpriv", f"--reuid={UNPRIVILEGED_UID}", f"--regid={UNPRIVILEGED_UID}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all", "--")

CLUSTER_NET = "10.77.0.0/24"
CLUSTER_GW = "10.77.0.1"
CLUSTER_IP = "10.77.0.2"
MESH_NET = "10.254.0.0/16"
UNDERLAY_GW = "192.168.100.1"  # the gateway's "public" address, on a bridge all nodes hang off
SERVICE_NAME = "echo.default.svc.cluster.local"
SERVICE2_NAME = "echo2.default.svc.cluster.local"
HTTP_PORT = 8080
HTTP2_PORT = 8081
SINK_PORT = 9000
SOURCE_PORT = 9001
DNS_PORT = 53
COORDINATOR_PORT = 8700
WG_PORT = 51820
WS_PORT = 8443  # the gateway's WebSocket relay (plain: the demo has no TLS ingress)
WS_URL = f"ws://{UNDERLAY_GW}:{WS_PORT}/relay"
#: A standby gateway (:meth:`Mesh.add_standby_gateway`): its own namespace on the nodes' bridge,
#: its own link to the cluster, the same --route.
STANDBY_UNDERLAY = "192.168.100.250"
STANDBY_CLUSTER_GW, STANDBY_CLUSTER_IP = "10.78.0.1", "10.78.0.2"


def anex_argv() -> list[str]:
    """How to run the ``anex-agent`` CLI: the installed script next to this Python, else ``-m``."""
    script = Path(sys.executable).with_name("anex-agent")
    if script.exists():
        return [str(script)]
    found = shutil.which("anex-agent")
    return [found] if found else [sys.executable, "-m", "anex_agent"]


class ProcessDied(AnexError, RuntimeError):
    """A process the mesh started exited while we waited for it: waiting longer cannot help."""


def wait_until(predicate, timeout: float, what: str, interval: float = 0.1):
    """Poll ``predicate`` until it returns a truthy value; raise TimeoutError naming ``what``.

    Exceptions from ``predicate`` mean "not yet", except :class:`ProcessDied`, raised at once.
    """
    deadline = time.monotonic() + timeout
    last_err: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except ProcessDied:
            raise
        except Exception as err:  # the thing is not up yet
            last_err = err
        time.sleep(interval)
    raise TimeoutError(f"{what} not within {timeout:.0f} s" + (f" (last error: {last_err})" if last_err else ""))


@dataclass
class Node:
    """One node namespace and its agent process."""

    index: int
    ns: Namespace
    underlay: str  # the node's own (non-mesh) address
    gateway_underlay: str
    state_dir: Path
    log_path: Path
    proc: subprocess.Popen | None = None
    env: dict[str, str] = field(default_factory=dict)

    def status(self, api_port: int = 9555) -> dict:
        return _http_in(self.ns, f"http://127.0.0.1:{api_port}/status")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


def _http_in(ns: Namespace, url: str, timeout: float = 5) -> dict:
    code = (
        "import json,sys,urllib.request;"
        f"print(urllib.request.urlopen(sys.argv[1], timeout={timeout}).read().decode())"
    )
    out = ns.run([sys.executable, "-c", code, url], timeout=timeout + 5)
    return json.loads(out.stdout)


class Mesh:
    """Builds and owns the whole mesh. Use as a context manager, or call :meth:`close`."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cluster = Namespace("cl")
        self.gateway = Namespace("gw")
        self.namespaces: list[Namespace] = [self.cluster, self.gateway]
        self.nodes: list[Node] = []
        self.admin_token = secrets.token_urlsafe(24)
        self.coordinator_proc: subprocess.Popen | None = None
        self.coordinator_args: list[str] = []  # more flags for every start of the coordinator (--agent-binary ...)
        self.gateway_routes: list[str] = [CLUSTER_NET]  # the gateway's --route networks, at each start
        self.gateway_proc: subprocess.Popen | None = None
        self.gateway_token: str | None = None
        self.standby: Namespace | None = None  # a second gateway's namespace (add_standby_gateway)
        self.standby_proc: subprocess.Popen | None = None
        self._service_procs: list[subprocess.Popen] = []
        self._private_dirs: list[Path] = []  # state directories of unprivileged agents (outside workdir)
        self._memory_groups: list = []  # memory cgroups of agents started with a memory limit
        self._next_node = 1

    # ---------------------------------------------------------------- network

    def build_network(self) -> None:
        for ns in (self.cluster, self.gateway):
            ns.create()
        link(self.gateway, self.cluster, f"{CLUSTER_GW}/24", f"{CLUSTER_IP}/24")
        bridge(self.gateway, "br-nodes", f"{UNDERLAY_GW}/24")
        self.cluster.run(["ip", "route", "add", MESH_NET, "via", CLUSTER_GW])
        py = sys.executable
        services = [
            ["http", "--listen", f"{CLUSTER_IP}:{HTTP_PORT}", "--name", "echo"],
            ["http", "--listen", f"{CLUSTER_IP}:{HTTP2_PORT}", "--name", "echo2"],
            ["dns", "--listen", f"{CLUSTER_IP}:{DNS_PORT}", "--record", f"{SERVICE_NAME}={CLUSTER_IP}", "--record", f"{SERVICE2_NAME}={CLUSTER_IP}"],
            ["sink", "--listen", f"{CLUSTER_IP}:{SINK_PORT}"],
            ["source", "--listen", f"{CLUSTER_IP}:{SOURCE_PORT}"],
        ]
        for args in services:
            proc = self.cluster.popen([py, "-m", "anex_agent.testing.services", *args], stdout=subprocess.PIPE, stderr=self._logfile(f"cluster-{args[0]}"), text=True)
            line = proc.stdout.readline() if proc.stdout else ""
            if line.strip() != "ready":
                raise RuntimeError(f"cluster service {args[0]} did not start (see {self.workdir})")
            self._service_procs.append(proc)

    def _logfile(self, name: str):
        return open(self.workdir / f"{name}.log", "ab", buffering=0)

    # ---------------------------------------------------------------- coordinator

    @property
    def coordinator_url_for_gateway(self) -> str:
        return f"http://127.0.0.1:{COORDINATOR_PORT}"

    def coordinator_url_for(self, node: Node) -> str:
        return f"http://{UNDERLAY_GW}:{COORDINATOR_PORT}"

    def start_coordinator(self, heartbeat_interval: float | None = None, extra_env: dict[str, str] | None = None) -> None:
        """``anex-agent coordinator`` in the gateway namespace; ``heartbeat_interval`` is what nodes
        are told (``--heartbeat-interval``; None: the coordinator's default, 15 s); ``extra_env``:
        more variables for it (provisioning settings)."""
        state = self.workdir / "coordinator"
        state.mkdir(exist_ok=True)
        argv = [
            *anex_argv(), "coordinator",
            "--listen", f"0.0.0.0:{COORDINATOR_PORT}",
            "--state-dir", str(state),
        ]
        if heartbeat_interval is not None:
            argv += ["--heartbeat-interval", str(heartbeat_interval)]
        argv += self.coordinator_args
        env = {**os.environ, "ANEX_ADMIN_TOKEN": self.admin_token}
        env.update(extra_env or {})
        self.coordinator_proc = self.gateway.popen(argv, stdout=self._logfile("coordinator"), stderr=subprocess.STDOUT, env=env)
        wait_until(lambda: self._coordinator_ok(), 30, "the coordinator answering")

    def stop_coordinator(self) -> None:
        if self.coordinator_proc is not None:
            stop_processes([self.coordinator_proc])
            self.coordinator_proc = None

    def _coordinator_ok(self) -> bool:
        if self.coordinator_proc is not None and self.coordinator_proc.poll() is not None:
            raise ProcessDied(f"the coordinator exited with status {self.coordinator_proc.returncode}: {self._tail('coordinator')}")
        self.admin("GET", "/v1/nodes")
        return True

    def admin(self, method: str, path: str, body: dict | None = None) -> dict | None:
        """Call the coordinator's REST API as the admin (from the gateway namespace)."""
        code = (
            "import json,sys,urllib.request,urllib.error\n"
            "import os\nm,u,b=sys.argv[1:4]\nt=os.environ['ANEX_ADMIN_TOKEN']\n"
            "req=urllib.request.Request(u,method=m,data=b.encode() if b else None,headers={'Authorization':'Bearer '+t,'Content-Type':'application/json'})\n"
            "try:\n r=urllib.request.urlopen(req,timeout=10); print(r.status); print(r.read().decode())\n"
            "except urllib.error.HTTPError as e: print(e.code); print(e.read().decode())\n"
        )
        out = self.gateway.run(
            [sys.executable, "-c", code, method, self.coordinator_url_for_gateway + path, json.dumps(body) if body is not None else ""],
            timeout=20, env={**os.environ, "ANEX_ADMIN_TOKEN": self.admin_token},  # not argv: ps shows argv to everyone
        )
        status_line, _, text = out.stdout.partition("\n")
        status = int(status_line)
        if status >= 400:
            raise RuntimeError(f"{method} {path}: HTTP {status}: {text.strip()[:500]}")
        return json.loads(text) if text.strip() else None

    def observe(self, nodes: dict[str, str], wait: float) -> dict:
        """The coordinator's view of ``nodes`` (id -> name), waiting up to ``wait`` s for their
        telemetry: :mod:`anex_agent.demo.observe` run in the gateway namespace as the admin."""
        argv = [sys.executable, "-m", "anex_agent.demo.observe", "--coordinator", self.coordinator_url_for_gateway, "--wait", str(wait)]
        for node_id, name in nodes.items():
            argv += ["--node", f"{node_id}={name}"]
        out = self.gateway.run(argv, check=False, timeout=wait + 30, env={**os.environ, "ANEX_ADMIN_TOKEN": self.admin_token})
        try:
            return json.loads(out.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise RuntimeError(f"observing the coordinator failed: {(out.stderr.strip().splitlines() or ['no output'])[-1]}") from None

    def join_token(self, kind: str = "node", reusable: bool = False) -> str:
        created = self.admin("POST", "/v1/join-tokens", {"kind": kind, "reusable": reusable, "expires_in": 3600})
        assert created is not None
        return created["token"]

    # ---------------------------------------------------------------- gateway

    def start_gateway(self, ws_url: str = WS_URL, *, registered: bool = True) -> None:
        """``anex-agent gateway`` with its WebSocket relay on ``WS_PORT``; ``ws_url`` is what it
        advertises (a TLS-terminating proxy in front of the relay: that proxy's URL); a
        ``--route`` for each of :attr:`gateway_routes` (the cluster network unless a test adds one).

        Returns once its WireGuard interface is up and (unless ``registered=False``: the
        coordinator is down, it starts from its saved registration) the coordinator lists it."""
        if self.gateway_token is None:
            self.gateway_token = self.join_token("gateway", reusable=True)
        state = self.workdir / "gateway"
        state.mkdir(exist_ok=True)
        argv = [
            *anex_argv(), "gateway",
            "--coordinator", self.coordinator_url_for_gateway,
            "--state-dir", str(state),
            "--listen-udp", f"0.0.0.0:{WG_PORT}",
            "--endpoint", f"{UNDERLAY_GW}:{WG_PORT}",
            *(arg for route in self.gateway_routes for arg in ("--route", route)),
            "--dns-upstream", f"{CLUSTER_IP}:{DNS_PORT}",
            "--ws-listen", f"0.0.0.0:{WS_PORT}", "--ws-url", ws_url,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANEX_")}  # only what we pass below
        env["ANEX_GATEWAY_TOKEN"] = self.gateway_token  # not --token: ps shows argv to every local user
        log_from = self._log_size("gateway")
        self.gateway_proc = self.gateway.popen(argv, stdout=self._logfile("gateway"), stderr=subprocess.STDOUT, env=env)
        if registered:
            wait_until(self._gateway_registered, 30, "the gateway registering with the coordinator")
        wait_until(self._gateway_up, 30, "the gateway's WireGuard interface")
        # the listing above may still show the previous run's registration (same key, same id):
        # this run is started once it logged "gateway up", which comes after its registration
        # (or the saved one) is applied and saved to the state dir
        wait_until(lambda: self._gateway_started(log_from, registered), 30, "the gateway logging that it is up")

    def add_standby_gateway(self) -> None:
        """A namespace for a second gateway offering the same route: on the nodes' bridge at
        :data:`STANDBY_UNDERLAY`, with a link of its own to the cluster (start it with
        :meth:`start_standby`)."""
        self.standby = Namespace("gs")
        self.standby.create()
        self.namespaces.append(self.standby)
        link(self.gateway, self.standby, None, f"{STANDBY_UNDERLAY}/24", bridge_a="br-nodes")
        link(self.cluster, self.standby, f"{STANDBY_CLUSTER_IP}/24", f"{STANDBY_CLUSTER_GW}/24")
        self.standby.run(["ip", "route", "add", CLUSTER_NET, "via", STANDBY_CLUSTER_IP])

    def start_standby(self, *, registered: bool = True) -> None:
        """``anex-agent gateway`` in the standby namespace, the same --route as the first."""
        assert self.standby is not None, "add_standby_gateway() first"
        state = self.workdir / "gateway-standby"
        state.mkdir(exist_ok=True)
        argv = [
            *anex_argv(), "gateway", "--name", "standby",
            "--coordinator", f"http://{UNDERLAY_GW}:{COORDINATOR_PORT}",
            "--state-dir", str(state),
            "--listen-udp", f"0.0.0.0:{WG_PORT}",
            "--endpoint", f"{STANDBY_UNDERLAY}:{WG_PORT}",
            "--route", CLUSTER_NET,
            "--dns-upstream", f"{CLUSTER_IP}:{DNS_PORT}",
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANEX_")}
        env["ANEX_GATEWAY_TOKEN"] = self.gateway_token or self.join_token("gateway", reusable=True)
        self.standby_proc = self.standby.popen(argv, stdout=self._logfile("gateway-standby"), stderr=subprocess.STDOUT,
                                               env=env)
        if registered:
            wait_until(lambda: any(g["name"] == "standby" and not g.get("gone_at")
                                   for g in (self.admin("GET", "/v1/gateways") or {}).get("gateways", [])),
                       30, "the standby gateway registering with the coordinator")
        wait_until(lambda: bool(self.gateway_interfaces(self.standby)), 30, "the standby gateway's WireGuard interface")

    def kill_standby(self) -> None:
        if self.standby_proc is not None:
            self.standby_proc.kill()
            self.standby_proc.wait(timeout=10)
            self.standby_proc = None
        assert self.standby is not None
        wait_until(lambda: not self.gateway_interfaces(self.standby), 10, "the standby interface to disappear")

    def stop_standby(self) -> None:
        if self.standby_proc is not None:
            stop_processes([self.standby_proc])
            self.standby_proc = None

    def gateway_interfaces(self, ns: Namespace | None = None) -> list[str]:
        """Our WireGuard interfaces in the gateway namespace (or ``ns``)."""
        lines = (ns or self.gateway).run(["ip", "-o", "link"]).stdout.splitlines()
        return [l.split(": ")[1].split("@")[0] for l in lines if ": anx" in l and "anxd" not in l]

    def _log_size(self, name: str) -> int:
        try:
            return (self.workdir / f"{name}.log").stat().st_size
        except FileNotFoundError:
            return 0

    def _gateway_started(self, log_from: int, registered: bool) -> bool:
        """Whether the gateway started at log offset ``log_from`` logged that it is up (and,
        with ``registered``, that it registered rather than starting from its saved state)."""
        self._gateway_up()  # raises if it exited
        with open(self.workdir / "gateway.log", "rb") as f:
            f.seek(log_from)
            text = f.read().decode(errors="replace")
        return "gateway up:" in text and (not registered or "registered as gateway" in text)

    def _gateway_up(self) -> bool:
        if self.gateway_proc is not None and self.gateway_proc.poll() is not None:
            raise ProcessDied(f"the gateway exited with status {self.gateway_proc.returncode}: {self._tail('gateway')}")
        return bool(self.gateway_interfaces())

    def _gateway_registered(self) -> bool:
        if self.gateway_proc is not None and self.gateway_proc.poll() is not None:
            raise ProcessDied(f"the gateway exited with status {self.gateway_proc.returncode}: {self._tail('gateway')}")
        listed = self.admin("GET", "/v1/gateways") or {}
        return bool(listed.get("gateways"))

    def kill_gateway(self) -> None:
        """SIGKILL the gateway (a crash): its interface goes with its wireguard-go child."""
        if self.gateway_proc is not None:
            self.gateway_proc.kill()
            self.gateway_proc.wait(timeout=10)
            self.gateway_proc = None
        # wireguard-go children die with their parent (PDEATHSIG); wait for their interface to go
        wait_until(lambda: not [l for l in self.gateway.run(["ip", "-o", "link"]).stdout.splitlines() if ": anx" in l and "anxd" not in l], 10, "the gateway interface to disappear")

    def stop_gateway(self) -> None:
        if self.gateway_proc is not None:
            stop_processes([self.gateway_proc])
            self.gateway_proc = None

    # ---------------------------------------------------------------- nodes

    def add_node_namespace(self) -> Node:
        index = self._next_node
        self._next_node += 1
        ns = Namespace(f"n{index}")
        ns.create()
        self.namespaces.append(ns)
        node_addr = f"192.168.100.{1 + index}"
        link(self.gateway, ns, None, f"{node_addr}/24", bridge_a="br-nodes")
        node = Node(index, ns, node_addr, UNDERLAY_GW, self.workdir / f"node{index}-state", self.workdir / f"node{index}.log")
        self.nodes.append(node)
        return node

    def block_udp(self, node: Node, *, except_tcp_to: tuple[str, ...] = ()) -> None:
        """Drop every UDP datagram the node sends out of its namespace (the mesh interface and
        loopback excepted), as providers that block UDP do. ``except_tcp_to`` (``HOST:PORT``):
        when given, TCP is dropped too, except to these (a node whose only way out is a proxy)."""
        rules = ['oifname != "lo" oifname != "anxn*" meta l4proto udp drop']
        for target in except_tcp_to:
            host, port = parse.ip_port(target)
            rules.append(f'oifname != "lo" oifname != "anxn*" ip daddr {host} tcp dport {port} accept')
        if except_tcp_to:
            rules.append('oifname != "lo" oifname != "anxn*" meta l4proto tcp drop')
        ruleset = ("table inet demo_block_udp {\n chain out {\n  type filter hook output priority 0; policy accept;\n"
                   + "".join(f"  {r}\n" for r in rules) + " }\n}\n")
        self.unblock_udp(node)
        node.ns.run(["nft", "-f", "-"], input=ruleset)

    def unblock_udp(self, node: Node) -> None:
        node.ns.run(["nft", "delete", "table", "inet", "demo_block_udp"], check=False)

    def agent_env(self, node: Node, token: str | None = None, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANEX_", "GW_TUNNEL_"))}
        env.update(
            {
                "ANEX_COORDINATOR_URL": self.coordinator_url_for(node),
                "ANEX_JOIN_TOKEN": token if token is not None else self.join_token("node"),
                "ANEX_STATE_DIR": str(node.state_dir),
                "ANEX_ENGINE": "wireguard-go",
                "ANEX_NODE_NAME": f"demo-node-{node.index}",
                "ANEX_PROVIDER": "onprem",
            }
        )
        env.update(extra)
        return env

    def start_agent(self, node: Node, env: dict[str, str], command: list[str] | None = None, *, wait_ready: bool = True,
                    unprivileged: bool = False, memory_limit: int | None = None) -> subprocess.Popen:
        """``anex-agent run -- command`` (or ``daemon`` when no command) in the node's namespace.

        ``unprivileged``: as :data:`UNPRIVILEGED` (nobody, no capabilities), with a state
        directory of its own that nobody owns (``ANEX_STATE_DIR`` in ``env`` is replaced).
        ``memory_limit``: the agent (and so its workload) runs in a memory cgroup of its own with
        that many bytes, as a container with ``--memory`` does (:mod:`anex_agent.testing.memcg`)."""
        argv = [*anex_argv(), "run", "--", *command] if command else [*anex_argv(), "daemon"]
        if unprivileged:
            import tempfile

            node.state_dir = Path(tempfile.mkdtemp(prefix="anex-unpriv-"))
            os.chown(node.state_dir, UNPRIVILEGED_UID, UNPRIVILEGED_UID)
            self._private_dirs.append(node.state_dir)
            env = {**env, "ANEX_STATE_DIR": str(node.state_dir)}
            argv = [*UNPRIVILEGED, *argv]
        node.env = env
        log = open(node.log_path, "ab", buffering=0)
        if memory_limit is None:
            node.proc = node.ns.popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        else:
            from anex_agent.testing.memcg import make_group

            group = make_group(memory_limit, prefix="anex-machine")
            self._memory_groups.append(group)
            # into the group on the host's /sys, then the namespace, where the hierarchy is mounted again
            node.proc = subprocess.Popen([*group.enter_argv(), *node.ns.argv([*group.mount_argv(), *argv])],
                                         stdout=log, stderr=subprocess.STDOUT, env=env)
            node.ns.procs.append(node.proc)
        if wait_ready:
            self.wait_agent_ready(node)
        return node.proc

    def wait_agent_ready(self, node: Node, timeout: float = 45) -> dict:
        def ready():
            if node.proc is not None and node.proc.poll() is not None:
                raise ProcessDied(f"agent of node {node.index} exited with status {node.proc.returncode}: {node.log()[-2000:]}")
            out = node.ns.run([sys.executable, "-c", _READYZ, "http://127.0.0.1:9555/readyz"], check=False, timeout=10)
            return out.returncode == 0

        wait_until(ready, timeout, f"node {node.index}'s agent ready (a handshake with the gateway)", interval=0.3)
        return node.status()

    def stop_agent(self, node: Node, timeout: float = 20) -> int | None:
        if node.proc is None:
            return None
        stop_processes([node.proc], timeout=timeout)
        code = node.proc.returncode
        node.proc = None
        return code

    # ---------------------------------------------------------------- life cycle

    def _tail(self, name: str, limit: int = 2000) -> str:
        try:
            return (self.workdir / f"{name}.log").read_text(errors="replace")[-limit:]
        except FileNotFoundError:
            return ""

    def close(self) -> None:
        procs = [n.proc for n in self.nodes if n.proc is not None]
        stop_processes(procs)
        for node in self.nodes:
            node.proc = None
        self.stop_gateway()
        self.stop_standby()
        self.stop_coordinator()
        stop_processes(self._service_procs)
        for ns in reversed(self.namespaces):
            ns.close()
        for path in self._private_dirs:
            shutil.rmtree(path, ignore_errors=True)
        for group in self._memory_groups:
            group.remove()

    def __enter__(self) -> Mesh:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_READYZ = (
    "import sys,urllib.request\n"
    "try:\n sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=3).status == 200 else 1)\n"
    "except Exception: sys.exit(1)\n"
)
