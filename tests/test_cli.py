"""The CLI dispatcher: usage, unknown commands, version."""

from anex_agent import cli


def test_help_lists_every_command(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in cli.COMMANDS:
        assert name in out


def test_unknown_command_is_status_2(capsys):
    assert cli.main(["nonsense"]) == 2
    assert "unknown command 'nonsense'" in capsys.readouterr().err


def test_every_command_module_imports_and_configures():
    import argparse
    import importlib

    for name, (module_name, _) in cli.COMMANDS.items():
        module = importlib.import_module(module_name)
        module.configure(argparse.ArgumentParser(prog=name))
        assert callable(module.main)


def test_a_command_error_is_prefixed_once(monkeypatch, capsys):
    """The dispatcher adds ``anex-agent COMMAND: ``; a command's error must not carry it again."""
    from anex_agent.testing import netlab

    monkeypatch.setattr(netlab, "missing_prerequisites", lambda *tools: "needs root (network namespaces)")
    assert cli.main(["demo", "--check"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("anex-agent demo: needs root (network namespaces); run it as root")
    assert err.count("anex-agent demo") == 1 and len(err.strip().splitlines()) == 1


def test_a_role_left_out_of_the_build_says_so_in_one_line(monkeypatch, capsys):
    """The single-file agent leaves the virtual node and its Kubernetes client out: the command
    names what is missing instead of a traceback."""
    import sys

    for name in [m for m in sys.modules if m.startswith("anex_agent.virtualnode.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "anex_agent.virtualnode", None)  # as PyInstaller's --exclude-module leaves it
    assert cli.main(["virtual-node", "--help"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("anex-agent virtual-node: not available in this build: the module 'anex_agent.virtualnode"), err
    assert len(err.strip().splitlines()) == 1


def test_the_virtual_node_without_its_kubernetes_client_says_so_in_one_line(monkeypatch, capsys):
    """The single-file agent leaves kubernetes_asyncio out: ``virtual-node`` names it, no traceback."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "kubernetes_asyncio" else real(name, *a))
    assert cli.main(["virtual-node", "--coordinator", "http://127.0.0.1:1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("anex-agent virtual-node: the virtual node needs the kubernetes_asyncio package"), err
    assert len(err.strip().splitlines()) == 1
