"""The coordinator's REST client and what the roles build on it.

- :mod:`.rest`: :class:`~anex_agent.client.rest.CoordinatorClient`, the async client of the REST API
  (agent, gateway, virtual node, ``anex-agent admin``, the demo).
- :mod:`.transport`: the coordinator URL check and the TLS client context.
- :mod:`.link`: the agent's and the gateway's link to the coordinator (join, re-join).
- :mod:`.join_token`: what a role says when the coordinator refuses its join token.

Shared by every role; imports no role.
"""
