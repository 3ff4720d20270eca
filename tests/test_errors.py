"""One error tree: every exception class of the package derives from ``AnexError``, and
``errors.py``'s docstring draws the whole tree as it is (names, parents, second bases, modules)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import pytest

import anex_agent
from anex_agent import errors
from anex_agent.errors import AnexError, BadRequest, RemoteProtocolError


def _exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined in a module of the package, by name (``module:Name``)."""
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(anex_agent.__path__, "anex_agent."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == module.__name__:
                found[f"{module.__name__}:{name}"] = obj
    return found


CLASSES = _exception_classes()
PUBLIC = {key: cls for key, cls in CLASSES.items() if not key.split(":")[1].startswith("_")}


def _drawn() -> dict[str, tuple[str, tuple[str, ...], str]]:
    """The tree in errors.py's docstring: name -> (parent, second bases, module path or '')."""
    doc = errors.__doc__ or ""
    block = doc[doc.index("    AnexError\n"):].split("\n\n")[0].splitlines()
    drawn: dict[str, tuple[str, tuple[str, ...], str]] = {}
    stack = ["AnexError"]
    for line in block[1:]:
        m = re.match(r"^(    [│ ]*[├└]── )(\w+)(?: \(([\w, ]+)\))?\s*([\w/]+\.py)?", line)
        assert m, f"cannot read the tree line {line!r}"
        depth = (len(m.group(1)) - 4) // 4
        name = m.group(2)
        del stack[depth:]
        drawn[name] = (stack[-1], tuple(b.strip() for b in (m.group(3) or "").split(",") if b.strip()), m.group(4) or "")
        stack.append(name)
    return drawn


def test_every_public_exception_joins_the_tree():
    outside = sorted(key for key, cls in PUBLIC.items() if not issubclass(cls, AnexError))
    assert outside == [], "derive these from anex_agent.errors.AnexError (or a family of it), keeping a " \
                          "builtin second base where callers catch it, or make them private (_Name)"


def test_every_exception_name_is_used_once():
    names = [key.split(":")[1] for key in PUBLIC]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def test_the_docstring_draws_the_tree_as_it_is():
    actual = {}
    for key, cls in PUBLIC.items():
        if cls is AnexError:
            continue
        module, name = key.split(":")
        parent, *second = cls.__bases__
        path = "" if module == "anex_agent.errors" else module.removeprefix("anex_agent.").replace(".", "/") + ".py"
        actual[name] = (parent.__name__, tuple(b.__name__ for b in second), path)
    assert _drawn() == actual


def test_the_reader_of_the_drawing_sees_parents_and_bases():
    drawn = _drawn()
    assert drawn["BadRequest"] == ("RemoteProtocolError", ("ValueError",), "")
    assert drawn["JobFailed"] == ("WorkerError", (), "selection/worker.py")
    assert drawn["NetlinkError"] == ("AnexError", ("OSError",), "tunnels/os/rtnl.py")


@pytest.mark.parametrize("key, builtin", [
    ("anex_agent.tunnels.os.rtnl:NetlinkError", OSError),
    ("anex_agent.coordinator.ssh_ca:PublicKeyRefused", ValueError),
    ("anex_agent.wire.proof:ProofError", ValueError),
    ("anex_agent.net.relay_protocol:RelayProtocolError", ValueError),
])
def test_callers_that_catch_a_builtin_still_catch_it(key, builtin):
    assert issubclass(CLASSES[key], builtin) and issubclass(CLASSES[key], AnexError)


def test_a_netlink_error_is_still_an_os_error_with_its_errno():
    from anex_agent.tunnels.os.rtnl import NetlinkError

    err = NetlinkError(17, "File exists")
    assert err.errno == 17 and err.strerror == "File exists" and isinstance(err, AnexError)


def test_one_bad_request_for_the_proxy_and_the_http_server():
    from anex_agent.frontends import proxy_core
    from anex_agent.net.http import server

    assert proxy_core.BadRequest is server.BadRequest is BadRequest
    err = BadRequest("the request target is not ASCII")
    assert err.reason == str(err) and isinstance(err, RemoteProtocolError) and isinstance(err, ValueError)
