"""Binds: the datagram path under the built-in WireGuard engine (wireguard-go's ``conn.Bind``).

:mod:`.base` is the seam; :mod:`.udp` a UDP socket, :mod:`.relay_client` a WebSocket relay to a gateway;
:mod:`.udp_probe` checks that UDP really reaches a gateway."""
