"""``anex-agent ssh NODE [-- CMD ARGS...]``: a shell or a command on a node, with no keys to manage.

What it does: makes a fresh Ed25519 key in memory (never written anywhere), asks the coordinator
(admin token) for a user certificate for that key and that node (``POST
/v1/nodes/{id}/ssh-certificates``), connects to the node's SSH server at its mesh address (this
machine needs a route to the mesh, as the cluster has through a gateway) and verifies the node's
host certificate against the coordinator's CA (the ``@cert-authority`` lines the certificate
answer carries): a node whose host key the CA did not certify for that address is refused.

With a terminal on stdin and no command, or with ``-t``, the session gets a PTY of the local
terminal's size (resizes follow), the local terminal is put in raw mode meanwhile. The exit
status is the remote command's (128+N when a signal N ended it; 255 when the session failed).

Quiet unless asked: asyncssh's connection log shows with ``-v`` (``anex-agent -v ssh ...``), its
debug lines with ``-vv``; a failure is one line (:func:`failure`: why, and for a connection
that failed, whether the coordinator has the node offline). Standard input may be a terminal,
a pipe, a file or a character device such as ``/dev/null`` (:func:`stdin_source`).

Settings: ``--coordinator`` / ``ANEX_COORDINATOR_URL``; the admin token from
``ANEX_ADMIN_TOKEN`` or ``ANEX_ADMIN_TOKEN_FILE`` (or ``--admin-token-file``), else the SSH
issuer token (``ANEX_SSH_ISSUER_TOKEN`` / ``_FILE``; NODE must then be a node id);
``--ca-file`` for an https:// coordinator with a private CA.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anex_agent.wire import ssh as ssh_wire
from anex_agent.host.config_secrets import SecretSpec, pick_secret
from anex_agent.errors import ConfigError, CoordinatorError

ADMIN_TOKEN = SecretSpec(None, "ANEX_ADMIN_TOKEN", file_flag="--admin-token-file")
ISSUER_TOKEN = SecretSpec(None, "ANEX_SSH_ISSUER_TOKEN")  # good only for certificates: NODE must be a node id
FAILED = 255  # as OpenSSH's ssh: the session itself failed
CONNECT_TIMEOUT = 15.0
NODE_ID = re.compile(r"n-[0-9a-f]{12}")  # what the coordinator gives as node ids (credentials.new_id)


@dataclass(frozen=True)
class Target:
    """A certificate for one node and how to reach it."""

    node_id: str
    address: str
    port: int
    key: Any = field(repr=False)  # asyncssh private key (in memory only)
    certificate: Any = field(repr=False)
    known_hosts: tuple[str, ...]
    serial: int
    node: Any = None  # the node as the coordinator listed it (wire.NodeView), None with the SSH issuer token


def add_coordinator_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--coordinator", metavar="URL", help="coordinator URL [ANEX_COORDINATOR_URL]")
    parser.add_argument("--admin-token-file", metavar="FILE", help="file holding the admin token "
                        "[ANEX_ADMIN_TOKEN, ANEX_ADMIN_TOKEN_FILE]")
    parser.add_argument("--ca-file", type=Path, metavar="FILE", help="PEM CA for an https:// coordinator")
    parser.add_argument("--validity", type=int, metavar="SECONDS",
                        help="certificate lifetime (default: the coordinator's, 10 minutes)")


def configure(parser: argparse.ArgumentParser) -> None:
    add_coordinator_arguments(parser)
    parser.add_argument("-t", action="store_true", dest="tty", help="ask for a terminal also with a command")
    parser.add_argument("-T", action="store_true", dest="no_tty", help="never ask for a terminal")
    parser.add_argument("-L", action="append", default=[], metavar="LOCAL_PORT:HOST:PORT", dest="forwards",
                        help="forward 127.0.0.1:LOCAL_PORT to HOST:PORT on the node (HOST: localhost)")
    parser.add_argument("node", metavar="NODE", help="node id or name")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS... (default: a login shell)")


def coordinator_client(args: argparse.Namespace, environ=None):
    from anex_agent.client.rest import CoordinatorClient

    env = os.environ if environ is None else environ
    url = args.coordinator or env.get("ANEX_COORDINATOR_URL")
    if not url:
        raise ConfigError("ANEX_COORDINATOR_URL", "is not set; expected the coordinator URL (or --coordinator)")
    token, _ = pick_secret(ADMIN_TOKEN, env, file_value=args.admin_token_file)
    lists_nodes = bool(token)
    if not token:
        token, _ = pick_secret(ISSUER_TOKEN, env)
    if not token:
        raise ConfigError("ANEX_ADMIN_TOKEN", "is not set; an SSH certificate needs the admin token "
                          "(or ANEX_ADMIN_TOKEN_FILE, --admin-token-file) or the SSH issuer token "
                          "(ANEX_SSH_ISSUER_TOKEN or ANEX_SSH_ISSUER_TOKEN_FILE)")
    client = CoordinatorClient(url.rstrip("/"), admin_token=token, ca_file=args.ca_file)
    client.lists_nodes = lists_nodes  # the SSH issuer token may not list nodes: NODE is then an id
    return client


async def resolve_node(client, node: str) -> str:
    """The id of the node named ``node`` (an id, or a name that exactly one node has).

    With the SSH issuer token (which may not list nodes: ``client.lists_nodes`` False)
    ``node`` is taken as a node id."""
    return (await lookup_node(client, node))[0]


async def lookup_node(client, node: str):
    """``(id, view)``: as :func:`resolve_node`, with the node's ``wire.NodeView`` (None with the
    SSH issuer token, which may not read nodes)."""
    if not getattr(client, "lists_nodes", True):
        return node, None
    if NODE_ID.fullmatch(node):  # an id is one lookup; only a name needs the list (a large fleet's is long)
        try:
            view = await client.get_node(node)
            return view.id, view
        except CoordinatorError as err:
            if err.status != 404:
                raise
    listed = await client.list_nodes()
    named = [n for n in listed.nodes if n.name == node]
    if len(named) == 1:
        return named[0].id, named[0]
    if named:
        ids = ", ".join(n.id for n in named)
        raise ConfigError("NODE", f"{len(named)} nodes are called {node!r} ({ids}); give the node id")
    raise ConfigError("NODE", f"no node {node!r}; see anex-agent admin nodes list")


async def certify(client, node: str, *, validity: int | None = None, requested_for: str = "",
                  features: list[str] | None = None) -> Target:
    """A fresh in-memory key and a certificate for it on ``node`` (an id or a unique name);
    ``features`` (``pty``, ``port-forwarding``, ``sftp``) default to the coordinator's: all."""
    from anex_agent.remote.asyncssh_import import load

    asyncssh = load()

    node_id, view = await lookup_node(client, node)
    key = asyncssh.generate_private_key("ssh-ed25519")
    answer = await client.create_ssh_certificate(node_id, ssh_wire.SshCertificateRequest(
        public_key=key.export_public_key().decode(), validity=validity,
        requested_for=requested_for or f"{os.environ.get('USER', 'anex-agent')} via anex-agent"[:128],
        **({"features": features} if features is not None else {})))
    return Target(node_id, answer.address, answer.port, key, asyncssh.import_certificate(answer.certificate),
                  tuple(answer.known_hosts), answer.serial, view)


def failure(target: Target, err: BaseException, *, connected: bool = False) -> str:
    """One line saying why the session with ``target`` failed: the error (a timeout says how long it
    waited, an OS error names its path as text), then, when the connection failed and the coordinator
    does not have the node ready, that it is offline, its state and its last heartbeat."""
    if isinstance(err, TimeoutError) and not str(err):
        why = f"no answer within {CONNECT_TIMEOUT:g} s"
    else:
        why = describe_os_error(err) if isinstance(err, OSError) else (str(err) or type(err).__name__)
    view = target.node
    where = f"node {target.node_id}" + (f" ({view.name})" if view is not None and view.name else "")
    line = f"{where} at {target.address}:{target.port}: {why}"
    if connected:
        return line
    state = getattr(getattr(view, "state", None), "value", None)
    if state is not None and state != "ready":
        last = view.last_heartbeat_at
        since = f"last heartbeat {last:%Y-%m-%d %H:%M:%SZ}" if last is not None else "no heartbeat since it joined"
        line += (f"; the node is offline: the coordinator has it {state.replace('_', ' ')} ({since}); "
                 "see anex-agent admin nodes show " + target.node_id)
    elif isinstance(err, TimeoutError):
        line += "; this machine needs a route to the mesh (through a gateway) to reach the node's address"
    return line


def describe_os_error(err: OSError) -> str:
    """``err`` as text, its paths decoded (asyncssh gives them as bytes): ``/tmp/x: No such file or directory``."""
    paths = [os.fsdecode(p) for p in (err.filename, err.filename2) if p is not None]
    text = err.strerror or str(err) or type(err).__name__
    return f"{' -> '.join(paths)}: {text}" if paths else text


#: Ciphers the client offers first: AES-GCM (AES-NI, one pass in ``cryptography``) costs about half
#: the CPU per MiB of asyncssh's default first choice, ChaCha20-Poly1305 (two passes and a new
#: cipher object per packet); the rest of asyncssh's defaults follow, so any server still agrees.
PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


def cipher_preference() -> list[str]:
    from asyncssh.encryption import get_default_encryption_algs

    defaults = [alg.decode() for alg in get_default_encryption_algs()]
    return [*(c for c in PREFERRED_CIPHERS if c in defaults), *(c for c in defaults if c not in PREFERRED_CIPHERS)]


async def connect(target: Target):
    """An asyncssh connection to the node; the host certificate must verify against the CA."""
    import asyncssh

    known = asyncssh.import_known_hosts("".join(line + "\n" for line in target.known_hosts))
    async with asyncio.timeout(CONNECT_TIMEOUT):
        return await asyncssh.connect(
            target.address, target.port, username=target.node_id, client_keys=[(target.key, target.certificate)],
            known_hosts=known, agent_path=None, agent_forwarding=False, x11_forwarding=False, config=None,
            preferred_auth="publickey", encryption_algs=cipher_preference())


def exit_code(result_status: int | None, result_signal) -> int:
    if result_signal:
        try:
            return 128 + int(signal.Signals["SIG" + result_signal[0]])
        except KeyError:
            return FAILED
    return FAILED if result_status is None else result_status


async def _session(conn, command: str | None, want_tty: bool) -> int:
    stdin_fd, stdout_fd = sys.stdin.fileno(), sys.stdout.fileno()
    term = os.environ.get("TERM", "xterm") if want_tty else None
    size = os.get_terminal_size(stdout_fd if os.isatty(stdout_fd) else stdin_fd) if want_tty else None
    process = await conn.create_process(command, term_type=term,
                                        term_size=(size.columns, size.lines) if size else None, encoding=None)
    loop = asyncio.get_running_loop()
    restore = None
    if want_tty and os.isatty(stdin_fd):
        import termios
        import tty

        restore = termios.tcgetattr(stdin_fd)
        tty.setraw(stdin_fd)
        loop.add_signal_handler(signal.SIGWINCH, lambda: process.change_terminal_size(
            *os.get_terminal_size(stdin_fd)))
    try:
        await process.redirect(stdin=stdin_source(stdin_fd), stdout=os.dup(stdout_fd),
                               stderr=os.dup(sys.stderr.fileno()))
        result = await process.wait(check=False)
    finally:
        if restore is not None:
            import termios

            loop.remove_signal_handler(signal.SIGWINCH)
            termios.tcsetattr(stdin_fd, termios.TCSADRAIN, restore)
    return exit_code(result.exit_status, result.exit_signal)


class _ThreadReader:
    """A file descriptor the event loop cannot watch (``/dev/null`` and other character devices
    that are not terminals: epoll refuses them), read in a thread for asyncssh's redirect."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    async def read(self, size: int) -> bytes:
        return await asyncio.to_thread(os.read, self._fd, size)

    async def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def stdin_source(fd: int):
    """What the session reads its input from: a copy of ``fd`` (a terminal, pipe, socket or regular
    file), or a :class:`_ThreadReader` for another character device such as ``/dev/null``."""
    import stat

    copy = os.dup(fd)
    if stat.S_ISCHR(os.fstat(copy).st_mode) and not os.isatty(copy):
        return _ThreadReader(copy)
    return copy


def quiet_asyncssh(verbose: int) -> None:
    """asyncssh logs each step of a connection at INFO: shown with ``-v``, its debug lines with ``-vv``."""
    import logging

    logging.getLogger("asyncssh").setLevel(logging.WARNING if not verbose else
                                           logging.INFO if verbose == 1 else logging.DEBUG)


async def run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    import shlex

    text = shlex.join(command) if command else None
    want_tty = not args.no_tty and (args.tty or (text is None and os.isatty(sys.stdin.fileno())))
    client = coordinator_client(args)
    try:
        target = await certify(client, args.node, validity=args.validity)
    finally:
        await client.close()
    import asyncssh

    try:
        conn = await connect(target)
    except (asyncssh.Error, OSError, TimeoutError) as err:
        print(f"anex-agent ssh: {failure(target, err)}", file=sys.stderr)
        return FAILED
    try:
        async with conn:
            listeners = []
            for spec in args.forwards:
                local, host, port = _forward_spec(spec)
                listeners.append(await conn.forward_local_port("127.0.0.1", local, host, port))
            if listeners and text is None and not os.isatty(sys.stdin.fileno()):
                await conn.wait_closed()
                return 0
            return await _session(conn, text, want_tty)
    except (asyncssh.Error, OSError, TimeoutError) as err:
        print(f"anex-agent ssh: {failure(target, err, connected=True)}", file=sys.stderr)
        return FAILED


def _forward_spec(spec: str) -> tuple[int, str, int]:
    from anex_agent import parse

    try:
        local, rest = spec.split(":", 1)
        host, port = parse.host_port(rest)
        return parse.port(local), host, port
    except ValueError:
        raise ConfigError("-L", f"{spec!r}: expected LOCAL_PORT:HOST:PORT") from None


def main(args: argparse.Namespace) -> int:
    quiet_asyncssh(getattr(args, "verbose", 0))
    try:
        return asyncio.run(run(args))
    except CoordinatorError as err:
        print(f"anex-agent ssh: {err}", file=sys.stderr)
        return FAILED
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
