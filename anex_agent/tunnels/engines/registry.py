"""Which engines exist in this build and which one to run: ``--engine``/``ANEX_ENGINE`` to a class.

:func:`engine_classes` imports the engine modules lazily (an engine whose module is absent from a
build is simply not offered); :func:`choose_engine` picks the first of :data:`AUTO_ORDER` that runs
here (and, for a node, serves the workload), or checks the one named, and returns every probe's
:class:`~anex_agent.tunnels.engines.status.Support` answer for the reports. A setting that does
not fit raises :class:`anex_agent.errors.ConfigError` naming it, with the accepted names and those
that run here; ``auto`` finding nothing raises :class:`anex_agent.errors.EngineError`.
"""

from __future__ import annotations

from anex_agent.errors import ConfigError
from anex_agent.tunnels.engines.base import Engine
from anex_agent.tunnels.engines.status import Support

#: Order in which ``--engine auto`` tries engines: the first supported one wins. For the
#: agent (``choose_engine(..., for_workload=True)``) an engine must also be able to serve
#: the workload (:meth:`Engine.workload_support`). The built-in userspace engine (WireGuard
#: and a TCP/IP stack in this process) needs no capability, TUN device or binary, so a node
#: where kernel WireGuard and wireguard-go cannot run gets it; wireproxy, an external binary,
#: is taken by auto only where userspace cannot serve.
AUTO_ORDER: tuple[str, ...] = ("kernel", "wireguard-go", "userspace", "wireproxy")


def engine_classes() -> dict[str, type[Engine]]:
    """Engines that exist in this build, keyed by name, in :data:`AUTO_ORDER`.

    Imported lazily (each module is small, but kernel/wireguard-go pull in pyroute2).
    An engine whose module cannot be imported in a build is simply absent.
    """
    import importlib

    modules = {
        "kernel": ("anex_agent.tunnels.engines.kernel", "KernelEngine"),
        "wireguard-go": ("anex_agent.tunnels.engines.wireguard_go", "WireguardGoEngine"),
        "userspace": ("anex_agent.tunnels.engines.userspace", "UserspaceEngine"),
        "wireproxy": ("anex_agent.tunnels.engines.wireproxy", "WireproxyEngine"),
    }
    found: dict[str, type[Engine]] = {}
    for name in AUTO_ORDER:
        module_name, attr = modules[name]
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name == module_name:
                continue
            raise
        cls = getattr(module, attr, None)
        if cls is not None:
            found[name] = cls
    return found


def choose_engine(requested: str = "auto", *, for_workload: bool = False,
                  source: str = "engine") -> tuple[type[Engine], dict[str, Support]]:
    """Pick the engine class for ``requested`` (a name or ``auto``).

    Returns the class and the Support answer of every engine probed (for reports).
    ``for_workload`` (the node agent): an engine must also serve the workload
    (:meth:`Engine.workload_support`); ``auto`` skips the others, recording why in the
    answers, and naming one explicitly raises ConfigError naming ``source`` (e.g.
    ``ANEX_ENGINE``) with the accepted names and those that run here. Without it (a bare
    tunnel, e.g. the gateway's hub), ``auto`` skips engines that only serve a workload
    (``frontends == "engine"``: wireproxy).
    Raises ConfigError naming ``source`` for an unknown name, and for a named engine that
    cannot run here (why, and the engines that do run here); EngineError when ``auto`` finds
    nothing suitable.
    """
    from anex_agent.errors import EngineError

    classes = engine_classes()
    if requested != "auto" and requested not in AUTO_ORDER:
        raise ConfigError(source, f"{requested!r} is not one of auto, {', '.join(AUTO_ORDER)}")
    if for_workload and requested != "auto":
        require_workload_engine(requested, source, classes)
    candidates = list(classes) if requested == "auto" else [requested]
    tried: dict[str, Support] = {}
    for name in candidates:
        cls = classes.get(name)
        if cls is None:
            tried[name] = Support(False, "not available in this build")
            continue
        if not for_workload and requested == "auto" and getattr(cls, "frontends", "dialer") == "engine":
            tried[name] = Support(False, "serves a node's workload only (its own proxy and tunnels), not a bare tunnel")
            continue
        support = cls.is_supported()
        if support.ok and for_workload:
            serves = cls.workload_support()
            if not serves.ok:
                tried[name] = Support(False, f"runs here but cannot serve the workload: {serves.reason}")
                continue
        tried[name] = support
        if support.ok:
            return cls, tried
    if requested != "auto":  # the one named cannot run here: a setting that does not fit this machine
        raise ConfigError(source, f"{requested!r}: the {requested} engine cannot run here "
                                  f"({tried[requested].reason}); engines that run here: "
                                  f"{', '.join(_usable_here(classes, for_workload, requested)) or 'none'}, "
                                  "or auto (leave it unset) to pick one")
    reasons = "; ".join(f"{n}: {s.reason}" for n, s in tried.items())
    raise EngineError(f"no usable WireGuard engine for {requested!r} ({reasons})")


def _usable_here(classes: dict[str, type[Engine]], for_workload: bool, skip: str) -> list[str]:
    """The engines (other than ``skip``) that run on this machine, and serve a workload when ``for_workload``
    (else: a bare tunnel, so not the workload-only ones)."""
    usable = []
    for name, cls in classes.items():
        if name == skip:
            continue
        if for_workload and not cls.workload_support().ok:
            continue
        if not for_workload and getattr(cls, "frontends", "dialer") == "engine":
            continue
        if cls.is_supported().ok:
            usable.append(name)
    return usable


def require_workload_engine(name: str, source: str, classes: dict[str, type[Engine]] | None = None) -> None:
    """ConfigError naming ``source`` when engine ``name`` cannot serve a workload (see :meth:`Engine.workload_support`).

    The message says why, which names are accepted, and which of them run on this machine.
    """
    classes = engine_classes() if classes is None else classes
    cls = classes.get(name)
    if cls is None:
        return  # absent: choose_engine reports "not available in this build"
    serves = cls.workload_support()
    if serves.ok:
        return
    accepted = ["auto"] + [n for n, c in classes.items() if c.workload_support().ok]
    here = [n for n in accepted[1:] if classes[n].is_supported().ok]
    raise ConfigError(source, f"{name!r} cannot serve the workload yet ({serves.reason}); accepted: "
                              f"{', '.join(accepted)}; usable on this machine: {', '.join(here) or 'none'}")
