"""Sans-I/O WireGuard protocol core (handshake, transport, timers, cookies, cryptokey routing)."""
