"""The coordinator: registration, IPAM, WireGuard peers, watch stream, telemetry, machine selection."""
