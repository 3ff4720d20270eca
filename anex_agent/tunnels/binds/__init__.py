"""Binds: the datagram path under the built-in WireGuard engine (wireguard-go's ``conn.Bind``).

:mod:`.base` is the seam; :mod:`.udp` a UDP socket; :mod:`.ws` the WebSocket relays (a Bind, and a
local relay for the native engines), :mod:`.switch` UDP and the relays side by side, both over
:mod:`.relay_client` (one connection to a gateway's relay) with the framing of :mod:`.relay_io`;
:mod:`.egress_proxy` the proxy a connection goes through; :mod:`.udp_probe` checks that UDP really
reaches a gateway."""
