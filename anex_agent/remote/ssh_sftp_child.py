"""An SFTP server on standard input and output, as the workload's account: the fallback the
agent's SSH server starts for an SFTP session when the image has no OpenSSH ``sftp-server``
(:mod:`.ssh_sftp`, docs/remote-access.md).

Run as ``python -I -c <boot> PACKAGE_ROOT UID GID GROUPS CWD CLIENT_VERSION`` by the agent
(root or the agent's own account). Contract:

* Everything is imported first (asyncssh's SFTP server included), while the process may still
  read the agent's installation; then, before one byte of standard input is read, the process
  takes the account: ``setgroups(GROUPS)``, ``setgid(GID)``, ``setuid(UID)`` (in that order, as
  the workload's own start), and checks it cannot take root back. Then it changes to ``CWD``
  (the workload's directory; the account's home, then ``/``, when it may not enter it).
* The SFTP protocol (version 3 with OpenSSH's extensions) is asyncssh's server implementation,
  driven over the two pipes; every file operation is a plain system call of this process, so
  the kernel checks it against the account, and what it creates belongs to the account.
* Exit status 0 when the client closed the session; 1 and a line on standard error when the
  account could not be taken or asyncssh's server cannot be driven (an asyncssh whose internal
  names changed): the session is refused rather than served as another account.
"""

from __future__ import annotations

import asyncio
import os
import sys


class _Channel:
    """What asyncssh's SFTP handler asks of an SSH channel: whether it is closing, and its end."""

    def __init__(self, transport: asyncio.WriteTransport) -> None:
        self._transport = transport

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    async def wait_closed(self) -> None:
        return None

    def get_connection(self):
        return None

    def get_environment(self) -> dict[str, str]:
        return {}


class _Reader:
    def __init__(self, stream: asyncio.StreamReader, logger, client_version: str) -> None:
        self._stream, self.logger, self._client_version = stream, logger, client_version

    async def readexactly(self, n: int) -> bytes:
        return await self._stream.readexactly(n)  # IncompleteReadError is an EOFError: the session ended

    def get_extra_info(self, name: str, default=None):
        return self._client_version if name == "client_version" else default


class _Writer:
    def __init__(self, transport: asyncio.WriteTransport, logger) -> None:
        self._transport, self.logger = transport, logger
        self.channel = _Channel(transport)

    def write(self, data: bytes) -> None:
        self._transport.write(data)

    def write_eof(self) -> None:
        self._transport.close()

    def close(self) -> None:
        self._transport.close()


def take_account(uid: int, gid: int, groups: list[int]) -> None:
    """Become ``uid``/``gid`` with ``groups``; raises PermissionError if root could be taken back."""
    if os.geteuid() == 0:
        os.setgroups(groups)
        os.setgid(gid)
        os.setuid(uid)
    elif (os.getuid(), os.getgid()) != (uid, gid):
        raise PermissionError(f"cannot become uid {uid} from uid {os.getuid()}")
    if uid != 0:
        try:
            os.setuid(0)
        except PermissionError:
            pass
        else:
            raise PermissionError("root could be taken back after dropping privileges")


def enter(cwd: str) -> None:
    for where in (cwd, os.path.expanduser("~"), "/"):
        try:
            os.chdir(where)
            return
        except OSError:
            continue


async def serve(client_version: str) -> None:
    import asyncssh.logging
    from asyncssh.sftp import SFTPServer, SFTPServerHandler

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    transport, _ = await loop.connect_write_pipe(asyncio.Protocol, sys.stdout.buffer)
    logger = asyncssh.logging.logger
    writer = _Writer(transport, logger)
    handler = SFTPServerHandler(SFTPServer(writer.channel), _Reader(reader, logger, client_version), writer, 3)  # SFTP version 3, as OpenSSH
    await handler.run()


def main(argv: list[str]) -> int:
    uid, gid, groups, cwd, client_version = argv[0], argv[1], argv[2], argv[3], argv[4]
    try:
        import asyncssh.logging  # noqa: F401 (imported before the account is taken)
        from asyncssh.sftp import SFTPServer, SFTPServerHandler  # noqa: F401
    except ImportError as err:
        print(f"SFTP is not available on this node: no OpenSSH sftp-server and asyncssh cannot serve it ({err})",
              file=sys.stderr)
        return 1
    try:
        take_account(int(uid), int(gid), [int(g) for g in groups.split(",") if g])
    except (OSError, ValueError) as err:
        print(f"SFTP: cannot run as uid {uid}: {err}", file=sys.stderr)
        return 1
    enter(cwd)
    asyncio.run(serve(client_version))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
