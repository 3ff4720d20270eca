"""Networking every role shares: the Dialer seam, name resolution, the relay protocol and HTTP over h11.

- :mod:`.dialer`: how the workload's traffic opens connections into the mesh.
- :mod:`.resolver`: cluster names over the mesh, other names as configured.
- :mod:`.relay_protocol`: the WebSocket relay protocol between a node and a gateway (pure).
- :mod:`.peer_log`: what a peer sent, bounded, in a log line.
- :mod:`.http`: the small HTTP/1.1 client and server over h11 and asyncio streams.

Imports no role.
"""
