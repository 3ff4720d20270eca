"""The wire contract: what the coordinator, agents, gateways and tools send each other, as pure models.

- :mod:`.base`: :class:`~.base.Model` (the base of every wire model), the limits and the shared field types.
- :mod:`.join`: join tokens, the coordinator's key and the proof of key possession a join carries.
- :mod:`.nodes`: a node's join, its config (gateways, tunnels, DNS) and the admin's views of nodes.
- :mod:`.heartbeat`: the heartbeat, its answer, and the node and workload states they carry.
- :mod:`.telemetry`: the rules a heartbeat's telemetry block keeps as received.
- :mod:`.gateways`: a gateway's registration, the peers it serves, its credential's rotation.
- :mod:`.watch`: the events of the watch stream (``GET /v1/watch``).
- :mod:`.problem`: the error document of every route (RFC 9457).
- :mod:`.reader`: the tolerant reader clients read every answer with.
- :mod:`.ssh`: remote access (certificate requests and grants).
- :mod:`.provisioning`: the ``/v1/provisions`` routes' models.
- :mod:`.pod`: what the virtual node and the agent agree on about a pod.
- :mod:`.route_policy`: which networks a gateway may offer to nodes.
- :mod:`.keys`: WireGuard key pairs in their base64 text form.
- :mod:`.proof`: proof of key possession for join and registration.
- :mod:`.access_token`: the short-lived tokens of the agent API, signed by the coordinator.

Shared by every role; imports no role and no I/O beyond reading a key file.
"""
