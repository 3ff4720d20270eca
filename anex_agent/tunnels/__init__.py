"""WireGuard engines and the paths under them, over the host's network plumbing.

- :mod:`.engines`: the engine contract (:mod:`.engines.base`) and the engines (kernel, wireguard-go,
  the built-in userspace one, wireproxy), with endpoint resolution, ``detect`` and ``cleanup``.
- :mod:`.binds`: the datagram path under the built-in engine (UDP, a WebSocket relay).
- :mod:`.os`: Linux plumbing the engines drive (rtnetlink, the UAPI socket, addresses and routes,
  capabilities, child processes).
"""
