"""The admin's limit on what gateways offer: a registration offering a network outside it is refused.

Contract: :func:`check` raises a 422 problem with one ``errors`` entry per refused
route, named ``routes.N`` (N: its index in the request), before anything is stored;
the ``detail`` repeats each field with its reason, so a client that prints only the
detail (the gateway's log) still says which network and why.
The rules themselves live in :mod:`anex_agent.wire.route_policy` (shared with the node).
"""

from __future__ import annotations

from collections.abc import Sequence

from anex_agent.wire import route_policy
from anex_agent.coordinator import problems
from anex_agent.coordinator.settings import Settings
from anex_agent.errors import ConfigError


def from_flags(values: Sequence[str]) -> tuple[str, ...]:
    """``--gateway-route`` values -> the setting: none given = the default list, ``none`` = an empty one.

    Each value is normalised (``10.96.0.1/12`` -> ``10.96.0.0/12``); ConfigError names the flag.
    """
    if not values:
        return route_policy.DEFAULT_GATEWAY_ROUTES
    if [v.strip().lower() for v in values] == ["none"]:
        return ()
    networks: dict[str, None] = {}
    for value in values:
        try:
            networks[str(route_policy.parse(value))] = None
        except ValueError:
            raise ConfigError("--gateway-route", f"{value!r} must be a network in CIDR form, e.g. 10.96.0.0/12, "
                                                 "or 'none' alone") from None
    return tuple(networks)


def check(settings: Settings, routes: Sequence[str]) -> None:
    """Raise a 422 :class:`problems.Problem` naming each route a gateway may not offer."""
    errors = []
    for index, route in enumerate(routes):
        why = route_policy.offer_problem(route, settings.gateway_routes, settings.pool.cidr)
        if why is not None:
            errors.append({"field": f"routes.{index}", "message": why})
    if errors:
        detail = "invalid body: " + "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        raise problems.Problem(422, "Unprocessable Content", detail, slug="validation", errors=errors)
