"""The protocol core is sans-I/O: no asyncio, socket, time (or other clock/I/O) imports in anex_agent/wg."""

import ast
from pathlib import Path

import anex_agent.wg

FORBIDDEN = {"asyncio", "socket", "time", "selectors", "threading", "datetime", "subprocess"}


def test_no_io_or_clock_imports():
    root = Path(anex_agent.wg.__file__).parent
    offenders = []
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert len(list(root.glob("*.py"))) >= 10
    assert offenders == []
