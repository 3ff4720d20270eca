"""The gateway: WireGuard hub for the mesh's nodes, routes and NAT into the cluster, DNS for the mesh.

It does not relay WireGuard over WebSocket: ``--ws-url`` only records a relay URL in the
gateway's registration, for nodes whose UDP is blocked; nodes do not use it yet.
"""
