"""Remote access to nodes over SSH, the command-line side: ``anex-agent ssh`` and ``anex-agent cp``.

- :mod:`.ssh_client`: a shell or a command on a node, with a short-lived certificate.
- :mod:`.cp_client`: copying files to or from a node over SFTP.
- :mod:`.asyncssh_import`: importing asyncssh without its slow start-up probes.

The wire models are :mod:`anex_agent.wire.ssh`; the node's server is :mod:`anex_agent.agent.ssh_server`
and the coordinator's certificate authority :mod:`anex_agent.coordinator.ssh_ca`.
"""
