"""The kubelet API's streaming verbs on rented pods: exec, attach and port-forward.

:func:`add_routes` puts ``/exec``, ``/attach`` and ``/portForward`` on the kubelet server's
aiohttp application. The protocol cores (:mod:`.spdy`, :mod:`.channels`) do no I/O; the
handlers bridge each request to the node over the mesh through the node's SSH server.
"""
