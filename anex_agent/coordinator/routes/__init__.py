"""Route modules of the coordinator; each provides ``setup(registry, ctx)``. See :mod:`..app`."""
