"""The netstack core is sans-I/O: no asyncio, socket, time (or other clock/I/O) imports, except the adapter."""

import ast
from pathlib import Path

import anex_agent.netstack

FORBIDDEN = {"asyncio", "socket", "time", "selectors", "threading", "datetime", "subprocess"}
ADAPTERS = {"aio.py", "dialer.py"}


def test_core_has_no_io_or_clock_imports():
    root = Path(anex_agent.netstack.__file__).parent
    files = [p for p in sorted(root.rglob("*.py")) if p.name not in ADAPTERS]
    offenders = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN or n.endswith((".aio", ".dialer"))]
    assert len(files) >= 10
    assert offenders == []
