"""An unprivileged user (root's state dir, root's sockets, no CAP_NET_ADMIN) gets one line
naming the path and what to do, never a traceback.

The permission failures are injected (the suite may run as root, whom file modes do not stop);
``cleanup`` is fed fake leftovers only: the real one would touch this namespace's interfaces.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import pytest

from anex_agent import cli
from anex_agent.host import statelock
from anex_agent.agent import cli_detect
from anex_agent.agent.state import KEY_FILE, StateDir
from anex_agent.tunnels.engines import cleanup as cleanup_mod


def denied(path) -> PermissionError:
    return PermissionError(errno.EACCES, "Permission denied", str(path))


STALE_SOCKETS = cleanup_mod.stale_sockets


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


# ---------------------------------------------------------------- the state dir's lock


def test_a_state_dir_this_user_may_not_write_is_one_line_naming_the_lock_and_the_way_out(tmp_path, monkeypatch):
    def refuse(path, *args, **kwargs):
        raise denied(path)
    monkeypatch.setattr(statelock.os, "open", refuse)
    with pytest.raises(statelock.ConfigError) as err:
        statelock.acquire(tmp_path / "state", "gateway")
    text = str(err.value)
    assert str(tmp_path / "state" / statelock.LOCK_NAME) in text and "Permission denied" in text
    assert "root" in text and "--state-dir" in text and "ANEX_STATE_DIR" in text


def test_gateway_on_a_state_dir_it_may_not_write_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ANEX_GATEWAY_TOKEN", "gateway-token")
    monkeypatch.setattr(statelock.os, "open", lambda path, *a, **k: (_ for _ in ()).throw(denied(path)))
    rc = cli.main(["gateway", "--coordinator", "http://127.0.0.1:1", "--route", "10.96.0.0/12",
                   "--listen-udp", "0.0.0.0:51820", "--endpoint", "192.0.2.1:51820", "--state-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    line = last_line(err)
    assert line.startswith("anex-agent gateway: state dir: ") and str(tmp_path / "instance.lock") in line
    assert "--state-dir or ANEX_STATE_DIR" in line


# ---------------------------------------------------------------- detect


@pytest.fixture
def joined_state(tmp_path):
    state = StateDir(tmp_path)
    state.ensure()
    (tmp_path / KEY_FILE).write_text("unreadable for this user\n")
    return tmp_path


def test_detect_on_a_state_dir_it_may_not_read_keeps_the_engine_report_and_ends_with_the_way_out(
        joined_state, monkeypatch, capsys):
    def refuse(self):
        raise denied(self.path / KEY_FILE)
    monkeypatch.setattr(StateDir, "load_config", refuse)
    monkeypatch.setattr(cli_detect, "detect_report", lambda: {"engines": {}, "udp": {"supported": True, "reason": "ok"},
                                                              "auto": "userspace"})
    assert cli.main(["detect", "--state-dir", str(joined_state)]) == 0
    out = capsys.readouterr().out
    assert "auto picks: userspace" in out and "Traceback" not in out
    line = last_line(out)
    assert line.startswith(f"cannot read {joined_state / KEY_FILE}: Permission denied")
    assert "run as root" in line and "--state-dir or ANEX_STATE_DIR" in line


def test_the_gateway_report_notes_a_state_dir_it_may_not_read(joined_state, monkeypatch, capsys):
    monkeypatch.setattr(Path, "exists", lambda self: (_ for _ in ()).throw(denied(self)))
    import asyncio

    report = asyncio.run(cli_detect.gateway_report(joined_state, {}))
    assert report["note"].startswith(f"cannot read {joined_state / KEY_FILE}: Permission denied")


# ---------------------------------------------------------------- cleanup


class RefusingSocket(socket.socket):
    """A UNIX socket whose connect is refused as another user's socket is: EACCES."""

    def connect(self, address):
        raise denied(address)


@pytest.fixture
def leftovers(tmp_path, monkeypatch):
    """A socket directory with one ``anx*.sock`` this user may not connect to; no process,
    interface or table of the real namespace is looked at."""
    path = tmp_path / "anxgw0123abcd.sock"
    path.write_text("")
    monkeypatch.setattr(cleanup_mod, "stale_sockets",
                        lambda prefix, denied=None: STALE_SOCKETS(prefix, str(tmp_path), denied=denied))
    monkeypatch.setattr(cleanup_mod, "orphan_wireguard_go", lambda prefix: [])
    from anex_agent.tunnels.os import netconf
    monkeypatch.setattr(netconf, "list_links", lambda prefix, kind=None: (_ for _ in ()).throw(denied("netlink")))
    monkeypatch.setattr(cleanup_mod, "nft_tables",
                        lambda prefix: (_ for _ in ()).throw(PermissionError(errno.EPERM, "Operation not permitted")))
    monkeypatch.setattr(cleanup_mod.socket, "socket", RefusingSocket)
    return path


def test_a_socket_it_may_not_connect_to_is_not_stale(leftovers):
    unchecked: list[str] = []
    assert STALE_SOCKETS("anx", str(leftovers.parent), denied=unchecked) == []
    assert unchecked == [str(leftovers)]


def test_cleanup_leaves_what_it_may_not_touch_and_ends_with_the_way_out(leftovers, capsys):
    assert cli.main(["cleanup"]) == 1
    assert leftovers.exists()  # never unlinked: it may well be a live gateway's
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "nothing to clean up" not in captured.out
    line = last_line(captured.err)
    assert line.startswith(f"anex-agent cleanup: permission denied: UAPI socket {leftovers}")
    assert "left alone" in line and "run 'anex-agent cleanup' as root" in line
    assert "listing nftables tables" in captured.err and "listing WireGuard interfaces" in captured.err


def test_a_stale_socket_it_may_not_remove_is_named_not_raised(tmp_path, monkeypatch):
    path = tmp_path / "anxnb0123abcd.sock"
    path.write_text("")
    monkeypatch.setattr(cleanup_mod, "stale_sockets", lambda prefix, denied=None: [str(path)])
    monkeypatch.setattr(cleanup_mod, "orphan_wireguard_go", lambda prefix: [])
    monkeypatch.setattr(cleanup_mod, "nft_tables", lambda prefix: [])
    from anex_agent.tunnels.os import netconf
    monkeypatch.setattr(netconf, "list_links", lambda prefix, kind=None: [])
    monkeypatch.setattr(cleanup_mod.os, "unlink", lambda p: (_ for _ in ()).throw(denied(p)))
    result = cleanup_mod.cleanup()
    assert result.denied == [f"stale UAPI socket {path}"] and result.done == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root is not stopped by file modes (the injected tests cover it)")
def test_as_an_unprivileged_user_a_root_only_state_dir_is_refused_for_real(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(statelock.ConfigError) as err:
        statelock.acquire(locked / "state", "run")
    assert "--state-dir or ANEX_STATE_DIR" in str(err.value)
