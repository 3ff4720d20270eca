"""The coordinator's route modules: which there are, loading them, collecting their migrations.

Extension point: ``ROUTE_MODULES`` lists the modules whose ``setup(registry, ctx)``
declares routes (add a module name here: a one-line additive edit); their routes
appear in ``/v1/openapi.json`` by themselves. A route module may define
``MIGRATIONS = [Migration(100, "...", "CREATE TABLE ...")]`` (number ranges in
:mod:`anex_agent.coordinator.migrations`); :func:`module_migrations` collects them and
:meth:`~anex_agent.coordinator.context.Coordinator.open` applies them with the core ones.

This module imports no route module at import time (they import the context, which
imports this): :func:`load_modules` imports them when called.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from types import ModuleType

from anex_agent.coordinator.migrations import Migration

ROUTE_MODULES: list[str] = [
    "anex_agent.coordinator.routes.ops",
    "anex_agent.coordinator.routes.tokens",
    "anex_agent.coordinator.routes.nodes",
    "anex_agent.coordinator.routes.gateways",
    "anex_agent.coordinator.routes.watch",
    "anex_agent.coordinator.routes.fleet_metrics",
    "anex_agent.coordinator.routes.selection",
    "anex_agent.coordinator.routes.labels",
    "anex_agent.coordinator.routes.agent_download",
    "anex_agent.coordinator.routes.provisions",
    "anex_agent.coordinator.routes.ssh",
]


def load_modules(names: Iterable[str] | None = None) -> list[ModuleType]:
    return [importlib.import_module(name) for name in (ROUTE_MODULES if names is None else names)]


def module_migrations(modules: Iterable[ModuleType]) -> list[Migration]:
    return [m for module in modules for m in getattr(module, "MIGRATIONS", [])]
