"""The agent's SSH server against asyncssh's client: certificates, revocation, sessions, SFTP, forwarding."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import asyncssh
import pytest

from anex_agent.wire import ssh as ssh_wire
from anex_agent.remote import ssh_server
from anex_agent.remote.ssh_access import SessionContext, SshAccess, load_or_create_host_key
from tests.polling import GENEROUS, wait_until

NODE = "n_test"


class Pki:
    def __init__(self) -> None:
        self.ca = asyncssh.generate_private_key("ssh-ed25519")
        self.serial = 0

    def ca_line(self) -> str:
        return self.ca.export_public_key().decode().strip()

    def user(self, *, node=NODE, features=ssh_wire.FEATURES, valid_for=600, signer=None):
        self.serial += 1
        key = asyncssh.generate_private_key("ssh-ed25519")
        key_id = ssh_wire.user_key_id(self.serial, node, list(features), "test")
        cert = (signer or self.ca).generate_user_certificate(
            key, key_id, serial=self.serial, principals=[node], valid_after=int(time.time()) - 60,
            valid_before=int(time.time()) + valid_for, permit_x11_forwarding=False, permit_agent_forwarding=False,
            permit_port_forwarding="port-forwarding" in features, permit_pty="pty" in features, permit_user_rc=False)
        return self.serial, key, cert


@pytest.fixture
async def server(tmp_path):
    pki = Pki()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "WORKLOAD_VAR": "yes"}
    access = SshAccess(tmp_path, 0, lambda: SessionContext(env=env, cwd=str(tmp_path)))
    host_key = ssh_server.host_key(access.host_key_seed)
    access.host_certificate = pki.ca.generate_host_certificate(
        host_key, "host", principals=[NODE, "127.0.0.1"]).export_certificate().decode()
    access.node_id, access.address = NODE, "127.0.0.1"
    access.user_ca_keys = (pki.ca_line(),)
    srv = await asyncio.get_running_loop().create_server(access.protocol_factory(), "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    yield pki, access, port
    srv.close()


def known_hosts(pki: Pki):
    return asyncssh.import_known_hosts(f"@cert-authority * {pki.ca_line()}\n")


async def connect(pki, port, key, cert, username=NODE):
    return await asyncssh.connect("127.0.0.1", port, username=username, client_keys=[(key, cert)],
                                  known_hosts=known_hosts(pki), agent_path=None)


async def test_exec_runs_in_the_workload_context_with_exit_status(server, tmp_path):
    pki, access, port = server
    _, key, cert = pki.user()
    async with await connect(pki, port, key, cert) as conn:
        result = await conn.run("echo $WORKLOAD_VAR; pwd; env | grep -c ^ANEX_ || true; exit 7")
        assert result.exit_status == 7
        lines = result.stdout.split()
        assert lines == ["yes", str(tmp_path), "0"]
        signalled = await conn.run("kill -TERM $$")
        assert signalled.exit_signal[0] == "TERM"
        fed = await conn.run("wc -c", input="hello")
        assert fed.stdout.strip() == "5"
    reports = [s for s in access._reports if s.kind == "exec"]
    assert [s.exit_status for s in reports if s.ended_at] == [7, None, 0]
    assert any(s.exit_signal == "TERM" for s in reports)


async def test_pty_has_the_window_size_and_follows_resizes(server):
    pki, _, port = server
    _, key, cert = pki.user()
    async with await connect(pki, port, key, cert) as conn:
        result = await conn.run("stty size", term_type="xterm", term_size=(91, 27))
        assert result.stdout.strip() == "27 91"
        process = await conn.create_process("read x; stty size", term_type="xterm", term_size=(80, 24))
        # the size change travels in the channel's stream before "go": the server sets it on the
        # terminal before it writes what follows (asyncssh raises TerminalSizeChanged in order)
        process.change_terminal_size(132, 43)
        process.stdin.write("go\n")
        out = await asyncio.wait_for(process.wait(), GENEROUS)
        assert out.stdout.strip().splitlines()[-1] == "43 132"


async def test_refused_without_a_valid_certificate_for_this_node(server):
    pki, access, port = server
    plain = asyncssh.generate_private_key("ssh-ed25519")
    with pytest.raises(asyncssh.PermissionDenied):
        await asyncssh.connect("127.0.0.1", port, username=NODE, client_keys=[plain], known_hosts=known_hosts(pki),
                               agent_path=None)
    _, key, cert = pki.user(node="n_other")
    with pytest.raises(asyncssh.PermissionDenied):  # another node's certificate, for this user name or its own
        await connect(pki, port, key, cert)
    with pytest.raises(asyncssh.PermissionDenied):
        await connect(pki, port, key, cert, username="n_other")
    _, key, cert = pki.user(valid_for=-30)
    with pytest.raises(asyncssh.PermissionDenied):  # expired
        await connect(pki, port, key, cert)
    _, key, cert = pki.user(signer=asyncssh.generate_private_key("ssh-ed25519"))
    with pytest.raises(asyncssh.PermissionDenied):  # another CA
        await connect(pki, port, key, cert)


async def test_a_revoked_serial_is_refused_and_its_connections_closed(server):
    pki, access, port = server
    serial, key, cert = pki.user()
    conn = await connect(pki, port, key, cert)
    assert (await conn.run("true")).exit_status == 0
    access.revoke(serial, time.time() + 600)
    await asyncio.wait_for(conn.wait_closed(), GENEROUS)
    with pytest.raises(asyncssh.PermissionDenied):
        await connect(pki, port, key, cert)
    access.load_revocations([])
    async with await connect(pki, port, key, cert):
        pass


async def test_sftp_both_ways_and_only_when_allowed(server, tmp_path):
    pki, _, port = server
    _, key, cert = pki.user()
    data = os.urandom(300_000)
    (tmp_path / "remote.bin").write_bytes(data)
    async with await connect(pki, port, key, cert) as conn:
        async with conn.start_sftp_client() as sftp:
            await sftp.get("remote.bin", str(tmp_path / "back.bin"))
            await sftp.put(str(tmp_path / "back.bin"), "uploaded.bin")
    assert (tmp_path / "back.bin").read_bytes() == data == (tmp_path / "uploaded.bin").read_bytes()
    _, key, cert = pki.user(features=["pty"])
    async with await connect(pki, port, key, cert) as conn:
        with pytest.raises((asyncssh.Error, ConnectionError, EOFError)):
            async with conn.start_sftp_client() as sftp:
                await sftp.listdir(".")


async def test_local_forward_reaches_only_this_node(server):
    pki, _, port = server

    async def echo(reader, writer):
        writer.write(await reader.read(100))
        await writer.drain()
        writer.close()

    target = await asyncio.start_server(echo, "127.0.0.1", 0)
    target_port = target.sockets[0].getsockname()[1]
    _, key, cert = pki.user()
    async with await connect(pki, port, key, cert) as conn:
        reader, writer = await conn.open_connection("localhost", target_port)
        writer.write(b"ping")
        assert await reader.read(100) == b"ping"
        with pytest.raises(asyncssh.ChannelOpenError):
            await conn.open_connection("192.0.2.1", 80)
        with pytest.raises(asyncssh.ChannelListenError):  # no remote forwarding
            await conn.forward_remote_port("", 0, "127.0.0.1", target_port)
    _, key, cert = pki.user(features=["sftp"])
    async with await connect(pki, port, key, cert) as conn:
        with pytest.raises(asyncssh.ChannelOpenError):
            await conn.open_connection("127.0.0.1", target_port)
    target.close()


async def test_our_client_agrees_on_aes_gcm_with_the_agent(server):
    """``anex-agent ssh`` and the virtual node (ssh_client.connect) offer AES-GCM first, cheaper per
    MiB than asyncssh's default ChaCha20-Poly1305; the agent's server takes the client's order."""
    from anex_agent.remote import ssh_client

    pki, _, port = server
    serial, key, cert = pki.user()
    target = ssh_client.Target(node_id=NODE, address="127.0.0.1", port=port, key=key, certificate=cert,
                               known_hosts=(f"@cert-authority * {pki.ca_line()}",), serial=serial)
    conn = await ssh_client.connect(target)
    try:
        assert conn.get_extra_info("send_cipher") == conn.get_extra_info("recv_cipher") == "aes128-gcm@openssh.com"
        assert set(ssh_client.cipher_preference()) >= {"chacha20-poly1305@openssh.com", "aes256-ctr"}  # the rest
    finally:
        conn.close()


def test_the_agent_does_not_import_asyncssh_until_a_connection(tmp_path):
    import subprocess

    code = ("import sys; from anex_agent.agent import supervisor; from anex_agent.remote import ssh_access; "
            f"ssh_access.SshAccess(__import__('pathlib').Path({str(tmp_path)!r}), 2222, lambda: None); "
            "print('asyncssh' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


async def test_a_client_that_goes_away_hangs_up_its_command(server, tmp_path):
    pki, _, port = server
    _, key, cert = pki.user()
    pidfile = tmp_path / "pid"
    conn = await connect(pki, port, key, cert)
    await conn.create_process(f"echo $$ > {pidfile}; exec sleep 30")
    await wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), what="the command's pid file")
    pid = int(pidfile.read_text())
    conn.close()

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
    await wait_until(gone, what="the command to end with its session (it outlived it)")


def test_host_key_file_holds_the_seed_and_its_public_form_is_what_openssh_reads(tmp_path):
    path = tmp_path / "ssh-host-key"
    seed, public = load_or_create_host_key(path)
    assert path.stat().st_mode & 0o777 == 0o600
    # the hand-made OpenSSH public form (RFC 8709) is what asyncssh makes of the same key
    assert public == " ".join(ssh_server.host_key(seed).export_public_key().decode().split()[:2])
    assert load_or_create_host_key(path) == (seed, public)  # read back, not made again
    path.chmod(0o644)
    with pytest.raises(Exception, match="0600"):
        load_or_create_host_key(path)


@pytest.fixture
def workload_dirs():
    """A working directory the unprivileged account owns, and one beside it that only root may write."""
    import shutil
    import tempfile

    base = tempfile.mkdtemp(prefix="anex-sftp-")
    os.chmod(base, 0o755)
    own, foreign = os.path.join(base, "own"), os.path.join(base, "foreign")
    os.mkdir(own)
    os.mkdir(foreign, 0o755)
    os.chown(own, NOBODY.uid, NOBODY.gid)
    yield own, foreign
    shutil.rmtree(base, ignore_errors=True)


from anex_agent.remote import ssh_sftp  # noqa: E402
from anex_agent.host.childenv import AccountInfo  # noqa: E402

NOBODY = AccountInfo("nobody", 65534, 65534, "/nonexistent", ())


@pytest.mark.skipif(os.geteuid() != 0, reason="taking another account needs root")
@pytest.mark.parametrize("implementation", ["openssh", "asyncssh"])
async def test_sftp_runs_as_the_workload_account_in_its_directory(server, workload_dirs, tmp_path, monkeypatch,
                                                                   implementation):
    import hashlib

    if implementation == "openssh" and ssh_sftp.find_sftp_server() is None:
        pytest.skip("OpenSSH's sftp-server (openssh-sftp-server) is not installed")
    if implementation == "asyncssh":
        monkeypatch.setattr(ssh_sftp, "SFTP_SERVER_PATHS", ())
    own, foreign = workload_dirs
    pki, access, port = server
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    access.context = lambda: SessionContext(env=env, account=NOBODY, cwd=own)
    data = os.urandom(700_000)
    (tmp_path / "local.bin").write_bytes(data)
    _, key, cert = pki.user()
    async with await connect(pki, port, key, cert) as conn:
        async with conn.start_sftp_client() as sftp:
            assert await sftp.realpath(".") == own  # starts in the workload's directory
            await sftp.put(str(tmp_path / "local.bin"), "up.bin")
            await sftp.get(f"{own}/up.bin", str(tmp_path / "back.bin"))
            with pytest.raises(asyncssh.SFTPPermissionDenied):  # root could; the account may not
                await sftp.put(str(tmp_path / "local.bin"), f"{foreign}/up.bin")
            with pytest.raises(asyncssh.SFTPPermissionDenied):
                await sftp.get("/etc/shadow", str(tmp_path / "shadow"))
    uploaded = os.stat(os.path.join(own, "up.bin"))
    assert (uploaded.st_uid, uploaded.st_gid) == (NOBODY.uid, NOBODY.gid)
    assert hashlib.sha256((tmp_path / "back.bin").read_bytes()).digest() == hashlib.sha256(data).digest()
    assert not os.path.exists(os.path.join(foreign, "up.bin"))
    [report] = [s for s in access._reports if s.kind == "sftp" and s.ended_at]
    assert report.exit_status == 0


def test_sftp_child_gets_the_workload_environment_and_no_privileges_to_keep():
    context = SessionContext(env={"PATH": "/bin", "KEEP": "1"}, account=NOBODY, cwd="/srv")
    child = ssh_sftp.sftp_child(context, "SSH-2.0-OpenSSH_9.2", paths=())
    assert child.server == "asyncssh" and child.ids == {}  # it takes the account itself, after its imports
    assert child.argv[-5:] == ("65534", "65534", "", "/srv", "SSH-2.0-OpenSSH_9.2")
    assert child.env == {"PATH": "/bin", "KEEP": "1", "HOME": "/nonexistent", "USER": "nobody", "LOGNAME": "nobody"}
    sftp_server = "/bin/true"
    child = ssh_sftp.sftp_child(context, paths=("/nonexistent/sftp-server", sftp_server))
    assert child.server == "openssh" and child.argv == (sftp_server,) and child.cwd == "/srv"
    if os.geteuid() != NOBODY.uid:
        assert child.ids == {"user": NOBODY.uid, "group": NOBODY.gid, "extra_groups": []}


async def test_pty_takes_the_terminal_modes_the_client_sends(server):
    pki, _, port = server
    _, key, cert = pki.user()
    modes = {asyncssh.PTY_ECHO: 0, asyncssh.PTY_ICANON: 1, asyncssh.PTY_VERASE: 8, asyncssh.PTY_VINTR: 255,
             asyncssh.PTY_ONLCR: 0, asyncssh.PTY_IUTF8: 1, asyncssh.PTY_OP_OSPEED: 9600}
    async with await connect(pki, port, key, cert) as conn:
        result = await conn.run("stty -a", term_type="xterm", term_size=(200, 24), term_modes=modes)
    words = result.stdout.replace(";", " ").split()
    assert "-echo" in words and "icanon" in words and "-onlcr" in words and "iutf8" in words, result.stdout
    text = " ".join(words)
    assert "erase = ^H" in text and "intr = <undef>" in text and "speed 9600 baud" in text
    async with await connect(pki, port, key, cert) as conn:  # without modes: the terminal's defaults
        result = await conn.run("stty -a", term_type="xterm", term_size=(200, 24))
    words = result.stdout.replace(";", " ").split()
    assert "echo" in words and "onlcr" in words and "intr = ^C" in " ".join(words)


def test_logs_under_its_own_module_name():
    """Log filters and levels set on ``anex_agent.remote`` reach the SSH server's lines."""
    assert ssh_server.log.name == "anex_agent.remote.ssh_server"
