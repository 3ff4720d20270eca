"""The gateway: WireGuard hub, WebSocket relay, routes and NAT into the cluster, DNS for the mesh."""
