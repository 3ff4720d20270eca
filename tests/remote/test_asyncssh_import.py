"""Importing asyncssh without its process-spawning library probes."""

from __future__ import annotations

import subprocess
import sys

from anex_agent.remote import asyncssh_import as ssh_asyncssh


def test_finds_libraries_where_the_loader_looks(tmp_path):
    (tmp_path / "liboqs.so.5").write_bytes(b"")
    conf = tmp_path / "ld.so.conf"
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "x.conf").write_text("/opt/libs  # comment\n")
    conf.write_text(f"include {tmp_path}/conf.d/*.conf\n")
    dirs = ssh_asyncssh.library_dirs({"LD_LIBRARY_PATH": str(tmp_path)}, conf=str(conf))
    assert dirs[:2] == [str(tmp_path), "/opt/libs"] and "/usr/lib" in dirs
    assert ssh_asyncssh.find_library("oqs", dirs) == str(tmp_path / "liboqs.so.5")
    assert ssh_asyncssh.find_library("liboqs", dirs) == str(tmp_path / "liboqs.so.5")
    assert ssh_asyncssh.find_library("no-such-lib", dirs) is None


def test_load_runs_no_process():
    code = ("import subprocess, sys\n"
            "def refuse(*a, **k): raise SystemExit('a process was started')\n"
            "subprocess.Popen.__init__ = refuse\n"
            "from anex_agent.remote import asyncssh_import as ssh_asyncssh\n"
            "m = ssh_asyncssh.load()\n"
            "import ctypes.util\n"
            "assert ctypes.util.find_library.__module__ == 'ctypes.util'\n"
            "print(m.__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "asyncssh", out.stderr
