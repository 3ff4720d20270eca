"""The wire contract: what the coordinator, agents, gateways and tools send each other, as pure models.

- :mod:`.models`: nodes, gateways, heartbeats, watch events and the tolerant reader every side uses.
- :mod:`.ssh`: remote access (certificate requests and grants).
- :mod:`.provisioning`: the ``/v1/provisions`` routes' models.
- :mod:`.route_policy`: which networks a gateway may offer to nodes.
- :mod:`.keys`: WireGuard key pairs in their base64 text form.
- :mod:`.proof`: proof of key possession for join and registration.
- :mod:`.access_token`: the short-lived tokens of the agent API, signed by the coordinator.

Shared by every role; imports no role and no I/O beyond reading a key file.
"""
