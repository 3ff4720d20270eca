"""Files a role creates are 0600 whatever the umask and the directory's mode."""

from __future__ import annotations

import os
import stat

import pytest

from anex_agent.host.private_file import ensure_private, open_private_append, tighten


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path, follow_symlinks=False).st_mode)


@pytest.fixture
def open_umask():
    old = os.umask(0)  # the worst a caller can start us with
    yield
    os.umask(old)


def test_created_files_are_private_under_any_umask(tmp_path, open_umask):
    ensure_private(tmp_path / "db")
    with open_private_append(tmp_path / "log") as handle:
        handle.write(b"line\n")
    assert mode(tmp_path / "db") == 0o600 and mode(tmp_path / "log") == 0o600
    assert (tmp_path / "db").read_bytes() == b""


def test_existing_files_others_may_read_are_tightened_and_keep_their_content(tmp_path):
    for name in ("db", "log", "wal"):
        (tmp_path / name).write_bytes(b"kept")
        os.chmod(tmp_path / name, 0o644)
    ensure_private(tmp_path / "db")
    open_private_append(tmp_path / "log").close()
    tighten(tmp_path / "wal")
    tighten(tmp_path / "missing")  # nothing to do
    for name in ("db", "log", "wal"):
        assert mode(tmp_path / name) == 0o600 and (tmp_path / name).read_bytes() == b"kept"
    assert not (tmp_path / "missing").exists()


def test_a_symbolic_link_is_refused(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("x")
    os.chmod(target, 0o644)
    (tmp_path / "db").symlink_to(target)
    with pytest.raises(OSError):
        ensure_private(tmp_path / "db")
    assert mode(target) == 0o644
