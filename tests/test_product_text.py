"""What users and maintainers read is true product text: no planning vocabulary
(issue numbers, "a later issue"), and documented lists that match the code."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import anex_agent
from anex_agent import errors

ROOT = Path(anex_agent.__file__).resolve().parent.parent
PLANNING = re.compile(r"(a|another|later|next|separate|future) issues?\b|issue #?[0-9]+", re.IGNORECASE)


def _product_files():
    for top in ("anex_agent", "docs", "systemd", "images"):
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                yield path
    yield ROOT / "README.md"


def test_no_text_refers_to_how_the_work_was_planned():
    found = []
    for path in _product_files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if PLANNING.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []


def test_the_error_tree_docstring_names_every_family():
    families = [cls for cls in vars(errors).values()
                if inspect.isclass(cls) and errors.AnexError in cls.__bases__]
    doc = errors.__doc__ or ""
    words = {3: "three", 4: "four", 5: "five", 6: "six", 7: "seven"}
    assert f"separates {words[len(families)]} families" in doc
    for cls in families:
        named = [cls, *cls.__subclasses__()] if cls is errors.ProtocolError else [cls]
        assert any(f":class:`{c.__name__}`" in doc for c in named), cls.__name__


def test_no_error_raised_through_the_cli_carries_the_cli_s_prefix():
    """``anex-agent COMMAND: `` is added once, by :func:`anex_agent.cli.main`, to every
    AnexError it prints: an error's own text (or a ConfigError's source) starting with it
    would print it twice (``anex-agent demo: anex-agent demo: needs root``)."""
    import ast

    from anex_agent import cli

    prefixes = tuple(f"anex-agent {name}" for name in cli.COMMANDS)
    found = []
    for path in sorted((ROOT / "anex_agent").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args):
                continue
            first = node.exc.args[0]
            text = first.value if isinstance(first, ast.Constant) else (
                first.values[0].value if isinstance(first, ast.JoinedStr) and first.values
                and isinstance(first.values[0], ast.Constant) else None)
            if isinstance(text, str) and text.startswith(prefixes):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text}")
    assert found == []


def test_the_demo_doc_shows_what_the_demo_runs():
    """docs/demo.md's example run has a row for every check of every node kind of
    ``NODE_KINDS`` (on the path the kind expects), of the provisioned machine and of the
    Kubernetes rows (:data:`anex_agent.demo.kubernetes.CHECKS`), and its total is the number
    of those rows."""
    from anex_agent.demo import NODE_KINDS
    from anex_agent.demo.kubernetes import CHECKS as KUBERNETES_CHECKS

    doc = (ROOT / "docs" / "demo.md").read_text()
    tables = doc.split("| check | what |")[1:]
    names = [[line.split("|")[1].strip() for line in block.split("\n\n", 1)[0].splitlines()[2:] if line.startswith("|")]
             for block in tables]
    node_checks, provision_checks, kubernetes_checks = names[0], names[1], names[2]
    assert node_checks[:6] == ["path", "proxy", "post", "connect", "tunnel", "inbound"]
    assert provision_checks == ["provision", "proxy", "delete"]
    assert kubernetes_checks == list(KUBERNETES_CHECKS)
    example = next(block for block in doc.split("```")[1::2] if "checks passed" in block)
    rows = [line for line in example.splitlines() if re.search(r"\s(ok|FAIL)\s", line)]
    for index, kind in enumerate(NODE_KINDS, 1):
        for check in node_checks:
            assert [r for r in rows if re.match(rf"{kind.label}-{index}\s+\S+\s+{kind.path}\s.*\s{check}\s+ok\s", r)], \
                (kind.label, check)
    for check in provision_checks:
        assert [r for r in rows if re.match(rf"provisioned\s.*\s{check}\s+ok\s", r)], check
    for check in kubernetes_checks:
        assert [r for r in rows if re.match(rf"kubernetes\s.*\s{check}\s+ok\s", r)], check
    expected = len(NODE_KINDS) * len(node_checks) + len(provision_checks) + len(kubernetes_checks)
    assert len(rows) == expected
    assert f"{expected}/{expected} checks passed" in example
