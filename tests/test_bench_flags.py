"""Benchmarks refuse bad flags with one line naming the flag, before any setup (no traceback)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("script, argv, flag", [
    ("bench_failover.py", ["--rounds", "0"], "--rounds"),
    ("bench_failover.py", ["--rounds", "-2"], "--rounds"),
    ("bench_relay_flood.py", ["--clients", "0"], "--clients"),
    ("bench_relay_flood.py", ["--seconds", "0"], "--seconds"),
    ("bench_relay_flood.py", ["--seconds", "-1.5"], "--seconds"),
    ("bench_relay_flood.py", ["--seconds", "nan"], "--seconds"),
    ("bench_longpipe.py", ["--kernel-cc", "no-such-algorithm"], "--kernel-cc"),
])
def test_refuses_non_positive(script, argv, flag):
    done = subprocess.run([sys.executable, str(ROOT / "bench" / script), *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert flag in last and "accepted" in last, last
    assert done.stdout == ""
