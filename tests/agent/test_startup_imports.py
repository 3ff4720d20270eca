"""What the node agent imports on its way up (``daemon``/``run``), checked in a fresh interpreter.

The agent's resident memory is mostly the modules it imports (see docs/agent.md,
"Footprint"), so the start-up path imports only what the role and the chosen engine use.
A subprocess runs the same imports as ``anex-agent daemon`` does (the CLI's dispatch, the
subcommand's ``main()`` imports, the engine probes, the modules the data plane, the
front-ends and the telemetry load while coming up) and reports ``sys.modules``. The
integration test ``integration/test_agent_footprint.py`` checks the same list in a real
daemon serving a proxied request.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: Never in a node agent: the other roles, the demo, and libraries only they (or only an
#: optional path) use. aiohttp: the agent's HTTP (coordinator client, agent API, wireproxy
#: health checks) goes over h11 (anex_agent.net.http.client, anex_agent.net.http.server).
NEVER = (
    "anex_agent.coordinator", "anex_agent.gateway", "anex_agent.selection", "anex_agent.demo",
    "asyncssh", "asyncpg", "aiohttp",
)
#: Imported only where used: netlink for WireGuard's own family (kernel engine), cluster name
#: lookups, cryptography's key serialisation formats. (websockets is not here: the coordinator's
#: watch stream, always open in a running agent, is a websockets client; it costs about 0.6 MB.)
LAZY = ("pyroute2", "dns", "cryptography.hazmat.primitives.serialization")

STARTUP = r"""
import argparse, importlib, json, sys
from anex_agent import cli
command = sys.argv[1]
module = importlib.import_module(cli.COMMANDS[command][0])
module.configure(argparse.ArgumentParser())
# what main() imports, then what the start-up imports on its way to a proxied answer
from anex_agent.agent.cli_detect import detect_report
from anex_agent.agent.supervisor import Agent
from anex_agent.tunnels.engines.registry import choose_engine
detect_report()
try:
    choose_engine("wireguard-go", for_workload=True)
except Exception:
    pass  # not usable here: the probe ran all the same
import anex_agent.tunnels.engines.wireguard_go, anex_agent.tunnels.os.netconf
from anex_agent.agent.dataplane import _forward_manager, _proxy
import anex_agent.frontends.proxy, anex_agent.frontends.forward
from anex_agent.agent.heartbeat import start_telemetry
import anex_agent.gpu.monitor, anex_agent.gpu.exposition
from anex_agent.gpu.nvml import Nvml
Nvml().ensure_ready()
# steady state: the agent API's modules (loaded once the data plane is up) and the
# coordinator client, as the supervisor imports them
from anex_agent.agent.supervisor import _api_modules
_api_modules()
import anex_agent.client.rest, anex_agent.client.link, anex_agent.tunnels.engines.wireproxy_process
print(json.dumps(sorted(sys.modules)))
"""


#: What ``daemon``/``run`` import before the data plane is up (the supervisor loads the rest later).
BEFORE_DATA_PLANE = ("import json, sys\n"
                     "import anex_agent.agent.cli_daemon, anex_agent.agent.cli_run, anex_agent.agent.supervisor\n"
                     "import anex_agent.agent.dataplane, anex_agent.agent.cli_detect\n"
                     "print(json.dumps(sorted(sys.modules)))")
SCRIPTS = {"daemon": (STARTUP, "daemon"), "run": (STARTUP, "run"), "before-data-plane": (BEFORE_DATA_PLANE,)}


class Interpreters:
    """The fresh interpreters of this module, all started at once (they are independent, and an
    interpreter's start-up is most of each test's time): :meth:`modules` is what one imported."""

    def __init__(self) -> None:
        self.procs = {name: subprocess.Popen([sys.executable, "-c", *argv], stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE, text=True)
                      for name, argv in SCRIPTS.items()}
        self.results: dict[str, set[str]] = {}

    def modules(self, name: str) -> set[str]:
        if name not in self.results:
            proc = self.procs[name]
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err[-3000:]
            self.results[name] = set(json.loads(out.strip().splitlines()[-1]))
        return self.results[name]

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


@pytest.fixture(scope="module")
def interpreters():
    started = Interpreters()
    try:
        yield started
    finally:
        started.close()


def offending(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


def _nvml_library_present() -> bool:
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.fixture(scope="module", params=["daemon", "run"])
def modules(request, interpreters) -> set[str]:
    return interpreters.modules(request.param)


def test_startup_imports_no_other_role_and_no_demo(modules):
    assert offending(modules, NEVER) == []


def test_startup_leaves_optional_libraries_unimported(modules):
    assert "anex_agent.tunnels.os.netconf" in modules and "anex_agent.frontends.proxy" in modules  # the path ran
    assert offending(modules, LAZY) == []


@pytest.mark.skipif(_nvml_library_present(), reason="libnvidia-ml.so.1 is installed: pynvml is rightly imported")
def test_no_nvml_library_means_no_pynvml(modules):
    assert "anex_agent.gpu.nvml" in modules
    assert offending(modules, ("pynvml",)) == []


def test_the_steady_agent_serves_its_api_without_aiohttp(modules):
    assert {"anex_agent.agent.api", "anex_agent.agent.logs_api", "anex_agent.agent.actions",
            "anex_agent.net.http.server", "anex_agent.net.http.client", "anex_agent.client.rest"} <= modules
    assert offending(modules, ("aiohttp",)) == []


def test_the_guard_sees_a_forbidden_import():
    assert offending({"anex_agent.gateway.relay", "anex_agent.gatewayish", "dns"}, NEVER + LAZY) == [
        "anex_agent.gateway.relay", "dns"]


def test_the_api_and_telemetry_modules_load_after_the_data_plane(interpreters):
    """Importing what ``daemon``/``run`` import before the data plane is up leaves the agent API's
    server and the telemetry out: the supervisor loads them in a thread once the proxy serves."""
    modules = interpreters.modules("before-data-plane")
    assert "anex_agent.agent.supervisor" in modules
    assert offending(modules, ("aiohttp.web", "prometheus_client", "psutil", "anex_agent.agent.api",
                               "anex_agent.gpu")) == []
