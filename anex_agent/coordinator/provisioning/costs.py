"""What provisions cost, as Prometheus series on the fleet side of the coordinator's ``/metrics``.

An attempt costs its price per hour times the time it was rented (:func:`store.attempt_cost`);
a provision the sum of its attempts. :data:`ROWS_SQL` reads what :func:`render` needs (the
provisioning loop refreshes it on every scheduling pass, so a scrape reads no database):

    anex_provision_cost_usd{provision,name}              running cost so far, USD
    anex_provision_price_per_hour_usd{provision,name}    price of the current rental, USD/hour
    anex_provision_retries{provision,name}               retries the recovery policy started since it was last ready
    anex_provisions{state}                               provisions by state (deleted ones left out)
"""

from __future__ import annotations

from anex_agent.coordinator.provisioning import store

ROWS_SQL = ("SELECT p.id, p.name, p.state, p.attempt, p.retries, a.number, a.price_per_hour, a.rented_at, a.ended_at"
            " FROM provisions p LEFT JOIN provision_attempts a ON a.provision_id = p.id"
            " WHERE p.state <> 'deleted' ORDER BY p.id, a.number")


def render(rows: list[dict], now: float) -> bytes:
    """The exposition text of ``rows`` (:data:`ROWS_SQL`) at ``now``."""
    cost: dict[tuple[str, str], float] = {}
    price: dict[tuple[str, str], float] = {}
    states: dict[str, int] = {}
    retries: dict[tuple[str, str], int] = {}
    seen: set[str] = set()
    for r in rows:
        key = (r["id"], r["name"])
        cost.setdefault(key, 0.0)
        retries[key] = int(r.get("retries") or 0)
        if r["id"] not in seen:
            seen.add(r["id"])
            states[r["state"]] = states.get(r["state"], 0) + 1
        if r["number"] is None:
            continue
        cost[key] += store.attempt_cost(r, now)
        if r["number"] == r["attempt"] and r["ended_at"] is None and r["rented_at"] is not None:
            price[key] = float(r["price_per_hour"] or 0.0)
    lines = ["# HELP anex_provision_cost_usd running cost of a provision's rentals so far (USD)",
             "# TYPE anex_provision_cost_usd gauge"]
    lines += [f'anex_provision_cost_usd{{provision="{pid}",name="{name}"}} {v:.6f}' for (pid, name), v in sorted(cost.items())]
    lines += ["# HELP anex_provision_price_per_hour_usd price of a provision's current rental (USD/hour)",
              "# TYPE anex_provision_price_per_hour_usd gauge"]
    lines += [f'anex_provision_price_per_hour_usd{{provision="{pid}",name="{name}"}} {v:.6f}'
              for (pid, name), v in sorted(price.items())]
    lines += ["# HELP anex_provision_retries retries the recovery policy started since the provision was last ready",
              "# TYPE anex_provision_retries gauge"]
    lines += [f'anex_provision_retries{{provision="{pid}",name="{name}"}} {n}' for (pid, name), n in sorted(retries.items())]
    lines += ["# HELP anex_provisions provisions by state (deleted ones left out)", "# TYPE anex_provisions gauge"]
    lines += [f'anex_provisions{{state="{s}"}} {n}' for s, n in sorted(states.items())]
    return ("\n".join(lines) + "\n").encode()
