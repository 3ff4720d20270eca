"""A real coordinator process, started the way users start it (``python -m anex_agent coordinator``).

Contract: :class:`CoordinatorProcess` runs the CLI from this checkout with exactly the
environment it is given (plus ``PYTHONPATH``); :meth:`~CoordinatorProcess.wait_listening`
returns the URL the coordinator logs once it listens (``http://`` or ``https://``) and
raises AssertionError carrying its stderr when it exits or does not listen in time;
:meth:`~CoordinatorProcess.stop` ends it (SIGTERM, then SIGKILL after 15 s) and returns
its stderr.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class CoordinatorProcess:
    def __init__(self, args: list[str], *, env: dict[str, str], cwd: Path = ROOT) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "anex_agent", "coordinator", *args],
            cwd=cwd,
            env={**env, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.url: str | None = None

    def wait_listening(self, timeout: float = 60) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            line = self.popen.stdout.readline()
            if not line:
                break
            match = re.search(r"listening on (https?://\S+)", line)
            if match:
                self.url = match.group(1)
                return self.url
        raise AssertionError(f"coordinator did not start: {self.stop()}")

    def stop(self) -> str:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        return self.popen.stderr.read()
