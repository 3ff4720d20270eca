"""anex-agent: node agent, gateway and coordinator of a WireGuard mesh for hybrid GPU clusters.

One package, three roles behind one CLI (``anex-agent``):

* the node agent (``run`` / ``daemon``), baked into rented containers or run by systemd;
* the gateway (``gateway``), the cluster side of the mesh;
* the coordinator (``coordinator``), the small central REST service.
"""

__version__ = "0.1.0"
