"""How a role's process lives on its host: files, locks, environment, secrets given at start, systemd.

- :mod:`.private_file`: files only their owner may read (credentials, keys, databases, logs).
- :mod:`.statelock`: one instance per state directory.
- :mod:`.config_secrets`: secrets from a flag, a file or the environment, parsed once at the edge.
- :mod:`.environ_block`: taking secrets out of ``/proc/<pid>/environ``.
- :mod:`.childenv`: the environment of every process the agent starts.
- :mod:`.sdnotify`: the systemd notify protocol (readiness, watchdog).
- :mod:`.loop_watchdog`: naming whatever keeps a role's event loop from running.

Shared by every role; imports no role.
"""
