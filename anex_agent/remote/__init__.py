"""Remote access to nodes over SSH: the node's server and the ``anex-agent ssh`` / ``cp`` clients.

The node's side (run by the agent):

- :mod:`.ssh_access`: the SSH server's state and its listener on the node's mesh address.
- :mod:`.ssh_server`: the server on asyncssh, authenticating by the coordinator's certificates, and
  the channels it accepts (sessions, local port forwarding).
- :mod:`.ssh_session`: what a session runs (a command, a shell, SFTP) as the workload's account,
  and its reports; :mod:`.ssh_process`: the session's process and its streams (pipes or a PTY).
- :mod:`.ssh_pty`: the terminal modes of a PTY request; :mod:`.ssh_sftp` and :mod:`.ssh_sftp_child`:
  SFTP in a child process as the workload's account.

The command-line side:

- :mod:`.ssh_client`: a shell or a command on a node, with a short-lived certificate.
- :mod:`.cp_client`: copying files to or from a node over SFTP.
- :mod:`.asyncssh_import`: importing asyncssh without its slow start-up probes.

The wire models are :mod:`anex_agent.wire.ssh`; the coordinator's certificate authority is
:mod:`anex_agent.coordinator.ssh_ca`. Imports no role.
"""
