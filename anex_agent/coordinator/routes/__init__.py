"""Every REST route of the coordinator, and how routes are declared and loaded.

Each route module provides ``setup(registry, ctx)`` (:mod:`.ops`, :mod:`.tokens`, :mod:`.nodes` with the
node handlers :mod:`.node_actions` and :mod:`.node_logs`, :mod:`.gateways`, :mod:`.watch`, :mod:`.labels`,
:mod:`.ssh`, :mod:`.provisions`, :mod:`.selection`, :mod:`.agent_download`, and :mod:`.fleet_metrics` on
``/metrics``). :mod:`.registry` declares each route once with its auth and models; :mod:`.modules` lists
the route modules and collects their migrations. The application is built in
:mod:`anex_agent.coordinator.app`.
"""
