"""What the workload sees, whatever the engine: the HTTP proxy and the GW_TUNNEL_<port> forwards."""
