"""WireGuard engines (kernel, wireguard-go, built-in userspace, external wireproxy) and their paths (binds)."""
