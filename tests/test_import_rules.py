"""The roles do not import each other, the shared packages import no role, the cores import no I/O or
clock, ``testing/`` stays out of the product, and the main packages form no import cycle; and
no module awaits with ``asyncio.wait_for`` (:func:`test_no_module_awaits_with_wait_for` says why).

Read from the source with :mod:`ast` (nothing is imported): every ``import`` and
``from ... import`` of every module under ``anex_agent/``, at any depth (a function-level
import is an import too). Imports under ``if TYPE_CHECKING:`` are left out: they never
run, so they tie no module to another at run time.

What the roles share lives in the shared packages (:data:`SHARED`: the wire contract, the
telemetry model, the coordinator client, the network and host plumbing, remote access, the
engines) and the foundation modules beside the CLI (errors, parse, tasks, backoff); see
docs/architecture.md.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "anex_agent"

# role -> packages it must not import. Machine selection and the providers run inside the
# coordinator (its routes and provisioning), so they count as the coordinator's: they read the
# telemetry model, never the agent's GPU package.
FORBIDDEN = {
    "anex_agent.agent": ("anex_agent.gateway", "anex_agent.coordinator", "anex_agent.virtualnode",
                         "anex_agent.selection", "anex_agent.providers"),
    "anex_agent.gateway": ("anex_agent.agent", "anex_agent.coordinator", "anex_agent.gpu", "anex_agent.virtualnode",
                           "anex_agent.selection", "anex_agent.providers"),
    "anex_agent.coordinator": ("anex_agent.agent", "anex_agent.gateway", "anex_agent.gpu", "anex_agent.virtualnode"),
    "anex_agent.selection": ("anex_agent.agent", "anex_agent.gateway", "anex_agent.gpu", "anex_agent.virtualnode"),
    "anex_agent.providers": ("anex_agent.agent", "anex_agent.gateway", "anex_agent.gpu", "anex_agent.virtualnode"),
    # the virtual node reaches the coordinator through its REST API only (anex_agent.client.rest)
    "anex_agent.virtualnode": ("anex_agent.agent", "anex_agent.gateway", "anex_agent.coordinator",
                               "anex_agent.selection", "anex_agent.providers", "anex_agent.gpu", "anex_agent.demo"),
}
# the shared packages and modules every role may import must not pull a role in behind its back
SHARED = tuple(f"anex_agent.{name}" for name in (  # (names built: a bare package name reads like a module)
    "wire", "telemetry", "client", "net", "host", "remote", "tunnels", "wg", "netstack", "frontends",
    "backoff", "errors", "parse", "tasks"))
ROLES = ("anex_agent.agent", "anex_agent.gateway", "anex_agent.coordinator", "anex_agent.gpu", "anex_agent.virtualnode",
         "anex_agent.selection", "anex_agent.providers", "anex_agent.admin", "anex_agent.demo")
# sans-I/O cores: bytes (and ``now``) in, what to do out; no event loop, socket or clock of their own
CORES = ("anex_agent.wg", "anex_agent.net.relay_protocol", "anex_agent.wire.proof", "anex_agent.wire.route_policy",
         "anex_agent.telemetry.bounds", "anex_agent.backoff", "anex_agent.coordinator.states",
         "anex_agent.tunnels.engines.wireproxy_config", "anex_agent.tunnels.engines.wireproxy_metrics",
         "anex_agent.tunnels.engines.config", "anex_agent.tunnels.engines.peer_plan", "anex_agent.tunnels.engines.ifnames",
         "anex_agent.frontends.proxy_core", "anex_agent.frontends.socks5_core",
         "anex_agent.frontends.socks5_udp_core")
NETSTACK_ADAPTERS = ("anex_agent.netstack.aio", "anex_agent.netstack.dialer")
IO_AND_CLOCK = ("asyncio", "socket", "time", "selectors", "threading", "subprocess")
# who may import the shared test harness: the demo command (and, outside the package, tests and bench)
TESTING = "anex_agent.testing"
TESTING_USERS = ("anex_agent.testing", "anex_agent.demo")
# who may draw random numbers from ``random``: the one retry delay (its jitter), and WireGuard's
# handshake retransmission jitter (a protocol timer, whitepaper §6.1). Secrets come from ``secrets``/``os``.
RANDOM_USERS = ("anex_agent.backoff", "anex_agent.wg.device")


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(path: Path, root: Path = PACKAGE, *, type_checking: bool = False) -> set[str]:
    """Every module ``path`` imports at run time (``from a import b`` counts as ``a`` and ``a.b``);
    with ``type_checking``, those imported for annotations only too."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test) and not type_checking:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return found


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
IMPORTS = {name: imports_of(path) for name, path in MODULES.items()}


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_the_parser_sees_imports_and_skips_type_checking_ones(tmp_path):
    pkg = tmp_path / "anex_agent" / "agent"
    pkg.mkdir(parents=True)
    source = pkg / "probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "import anex_agent.gateway.link\n"
        "from . import state\n"
        "from ..coordinator import app\n"
        "if TYPE_CHECKING:\n"
        "    from anex_agent.gpu import monitor\n"
        "def late():\n"
        "    from anex_agent.gpu.exposition import metric_families\n"
    )
    found = imports_of(source, tmp_path / "anex_agent")
    assert "anex_agent.gateway.link" in found
    assert "anex_agent.agent.state" in found
    assert "anex_agent.coordinator.app" in found
    assert "anex_agent.gpu.exposition" in found
    assert "anex_agent.gpu.monitor" not in found
    assert "anex_agent.gpu.monitor" in imports_of(source, tmp_path / "anex_agent", type_checking=True)


@pytest.mark.parametrize("role", sorted(FORBIDDEN))
def test_roles_do_not_import_each_other(role):
    offences = sorted(
        f"{name} imports {target}"
        for name, targets in IMPORTS.items() if _within(name, role)
        for target in targets for other in FORBIDDEN[role] if _within(target, other)
    )
    assert offences == []


def test_shared_modules_import_no_role():
    offences = sorted(
        f"{name} imports {target}"
        for name in IMPORTS if any(_within(name, shared) for shared in SHARED)
        for target in IMPORTS[name] for role in ROLES if _within(target, role)
    )
    assert offences == []


# part -> its owners: a part reports what happened (return values, an output object its owner
# passes in) and never imports who drives it, not even for annotations (that is the circle the
# run-time check cannot see)
OWNERS = {
    "anex_agent.netstack.tcp": ("anex_agent.netstack.stack", "anex_agent.netstack.aio", "anex_agent.netstack.dialer"),
}


@pytest.mark.parametrize("part", sorted(OWNERS))
def test_parts_do_not_import_their_owners(part):
    offences = sorted(
        f"{name} imports {target}"
        for name, path in MODULES.items() if _within(name, part)
        for target in imports_of(path, type_checking=True) for owner in OWNERS[part] if _within(target, owner)
    )
    assert offences == []


def test_cores_import_no_event_loop_socket_or_clock():
    netstack = [name for name in IMPORTS if _within(name, "anex_agent.netstack") and name not in NETSTACK_ADAPTERS]
    cores = [name for name in IMPORTS if any(_within(name, core) for core in CORES)] + netstack
    assert len(cores) > len(CORES)
    offences = sorted(f"{name} imports {target}" for name in cores
                      for target in IMPORTS[name] for io in IO_AND_CLOCK if _within(target, io))
    assert offences == []


def test_testing_is_imported_only_by_the_demo():
    offences = sorted(
        f"{name} imports {target}"
        for name, targets in IMPORTS.items() if not any(_within(name, user) for user in TESTING_USERS)
        for target in targets if _within(target, TESTING)
    )
    assert offences == []


def _graph(package: str) -> dict[str, set[str]]:
    """Edges between the modules of ``package`` (an import of a name resolves to its module)."""
    graph: dict[str, set[str]] = {}
    for name, targets in IMPORTS.items():
        if not _within(name, package):
            continue
        edges = set()
        for target in targets:
            if target in MODULES and _within(target, package) and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted.

    A package's ``__init__`` is left out: importing ``pkg.mod`` runs it first, but it
    only re-exports or is empty here, and counting it would tie every module to every other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strongconnect(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                strongconnect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            strongconnect(node)
    return out


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("package", [f"anex_agent.{name}" for name in (
    "coordinator", "agent", "virtualnode", "gateway", "tunnels", "net", "wire", "client", "host", "remote",
    "providers", "selection", "telemetry", "frontends", "testing", "gpu", "netstack",
)])
def test_no_import_cycles(package):
    graph = {name: {t for t in edges if not t.endswith("__init__") and t != package}
             for name, edges in _graph(package).items() if name != package}
    assert _cycles(graph) == []


def test_retry_jitter_is_drawn_only_by_backoff():
    """A retry or reconnect delay is an :class:`anex_agent.backoff.Backoff`: no module draws its own
    (a ``random`` imported only under ``TYPE_CHECKING``, to type an ``rng`` argument, does not count)."""
    drawing = sorted(name for name, imports in IMPORTS.items() if "random" in imports and name not in RANDOM_USERS)
    assert drawing == [], "take the delay from anex_agent.backoff.Backoff"


def _wait_for_calls(path: Path) -> list[int]:
    """Lines of ``path`` that call asyncio's ``wait_for``, however it was imported (``asyncio`` or
    ``asyncio.tasks`` under any name, or ``wait_for`` itself under any name)."""
    tree = ast.parse(path.read_text())
    modules: set[str] = set()  # local names of asyncio
    functions: set[str] = set()  # local names of wait_for
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {alias.asname or alias.name for alias in node.names if alias.name == "asyncio"}
        elif isinstance(node, ast.ImportFrom) and node.module in ("asyncio", "asyncio.tasks"):
            functions |= {alias.asname or alias.name for alias in node.names if alias.name == "wait_for"}

    def is_asyncio(value: ast.expr) -> bool:
        return (isinstance(value, ast.Name) and value.id in modules) or (
            isinstance(value, ast.Attribute) and value.attr == "tasks" and is_asyncio(value.value))

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if (isinstance(func, ast.Attribute) and func.attr == "wait_for" and is_asyncio(func.value)) or (
                    isinstance(func, ast.Name) and func.id in functions):
                lines.append(node.lineno)
    return sorted(lines)


def test_the_wait_for_check_finds_a_call(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import asyncio\nimport asyncio as aio\nfrom asyncio import wait_for\n"
                      "from asyncio.tasks import wait_for as wf\n\nasync def f(x):\n"
                      "    await asyncio.wait_for(x, 1)\n    await wait_for(x, 2)\n    await x.wait_for(3)\n"
                      "    await aio.wait_for(x, 4)\n    await asyncio.tasks.wait_for(x, 5)\n    await wf(x, 6)\n")
    assert _wait_for_calls(sample) == [7, 8, 10, 11, 12]


def test_no_module_awaits_with_wait_for():
    """Timeouts are ``asyncio.timeout``: Python 3.11's ``asyncio.wait_for`` returns the inner
    result when it completes as the caller is cancelled, and the cancel is lost (a loop that goes
    on then never stops: seen as a workload stop that waited for ever on a probe loop)."""
    found = {name: lines for name, path in MODULES.items() if (lines := _wait_for_calls(path))}
    assert found == {}, "use `async with asyncio.timeout(...)` instead"
