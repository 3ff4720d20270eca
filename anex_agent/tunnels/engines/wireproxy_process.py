"""The wireproxy process: run ``wireproxy -c <file> -i <health address>``, watch it, restart it.

:class:`WireproxyProcess` owns one child process and its config file:

* :meth:`~WireproxyProcess.ensure` writes the config (mode 0600: it holds the private
  key) and (re)starts the process when the text changed or it is not running;
* :meth:`~WireproxyProcess.supervise` (a task of the owning role, see
  :mod:`anex_agent.tasks`) restarts it when it exited, when ``/readyz`` failed
  ``failures_before_restart`` checks in a row (after its first 200, or ``start_grace``
  seconds), and when a start failed earlier (the binary was missing for a while). A
  failed restart raises out of the loop: the role's Tasks logs it and runs the loop
  again after a backoff, so the process comes back once it can;
* ``/readyz`` and ``/metrics`` are read over HTTP (:mod:`anex_agent.net.http.client`, a fresh
  connection each time) from the health address (loopback only).

The child is started with :func:`anex_agent.tunnels.os.process.spawn` (it dies with us).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from anex_agent.host.childenv import engine_env
from anex_agent.errors import EngineError
from anex_agent.net.http.client import HttpClient, HttpError
from anex_agent.tunnels.os import process

log = logging.getLogger(__name__)

STOP_GRACE = 5.0
#: Restart reasons kept for reports (the oldest are dropped); ``Supervision.starts`` counts them all.
RESTART_HISTORY = 20
#: The most of a /metrics or /readyz body we read (bytes).
MAX_BODY = 1 << 20


def free_loopback_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now (the kernel's pick), for wireproxy's ``-i``.

    Another process could take it before wireproxy binds it; wireproxy then exits and the
    supervisor restarts it (with the same address), which is reported.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def write_config(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically with mode 0600 (never readable by others, not even briefly)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=".wireproxy-", dir=path.parent)  # mkstemp creates 0600
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@dataclass
class Supervision:
    """What the supervisor did: process starts, and why the last RESTART_HISTORY restarts happened."""

    starts: int = 0
    restarts: list[str] = field(default_factory=list)
    health_failures: int = 0
    last_health: int | None = None  # HTTP status of the last /readyz, None if no answer


class WireproxyProcess:
    """One supervised wireproxy child. ``config_path``'s directory must be ours (0700)."""

    def __init__(self, *, binary: str, config_path: Path, health_address: str, health_interval: float = 5.0,
                 failures_before_restart: int = 3, start_grace: float = 20.0) -> None:
        self.binary = binary
        self.config_path = config_path
        self.health_address = health_address
        self.health_interval = health_interval
        self.failures_before_restart = failures_before_restart
        self.start_grace = start_grace
        self.supervision = Supervision()
        self._text: str | None = None  # the config we want running; None: stopped
        self._proc: asyncio.subprocess.Process | None = None
        self._started_at = 0.0
        self._seen_healthy = False
        self._lock = asyncio.Lock()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    @property
    def wanted(self) -> bool:
        """Whether a config is to run (after :meth:`ensure`, until :meth:`stop`)."""
        return self._text is not None

    async def ensure(self, text: str) -> bool:
        """Run wireproxy with config ``text``; True when it was (re)started, False when it already ran it."""
        async with self._lock:
            if text == self._text and self.running:
                return False
            write_config(self.config_path, text)
            self._text = text
            await self._restart("config changed" if self.supervision.starts else "first start")
            return True

    async def restart(self, reason: str) -> None:
        """Restart the process now (when one should run)."""
        async with self._lock:
            if self._text is not None:
                await self._restart(reason)

    async def supervise(self) -> None:
        """Forever: every ``health_interval`` s, restart the process when it is gone or unhealthy.

        Raises EngineError when a restart fails (to the owning role's Tasks, which logs it and
        runs this loop again after a backoff)."""
        while True:
            await asyncio.sleep(self.health_interval)
            async with self._lock:
                if self._text is None:
                    continue  # stopped: nothing should run
                if self._proc is None:
                    await self._restart("not running (its last start failed)")
                    continue
                if self._proc.returncode is not None:
                    await self._restart(f"process exited with status {self._proc.returncode}")
                    continue
                await self._check_health()

    async def get(self, path: str, timeout: float) -> tuple[int, str] | None:
        """(status, body) of ``GET path`` on the health address, or None when nothing answered in time."""
        # one connection per request: a restarted process must not meet a stale pooled one
        client = HttpClient(timeout=timeout)
        try:
            async with asyncio.timeout(timeout):
                async with client.stream("GET", f"http://{self.health_address}{path}", connect_timeout=None) as response:
                    body = bytearray()
                    async for chunk in response.chunks():
                        body += chunk[:MAX_BODY - len(body)]
                        if len(body) >= MAX_BODY:
                            break
                    return response.status, body.decode("utf-8", "replace")
        except (HttpError, TimeoutError, OSError) as err:
            log.debug("wireproxy %s: no answer: %s", path, err or type(err).__name__)
            return None
        finally:
            await client.close()

    async def stop(self) -> None:
        """Terminate the process, remove the config file (the private key does not outlive us)."""
        async with self._lock:
            self._text = None
            await self._terminate()
            with contextlib.suppress(FileNotFoundError):
                self.config_path.unlink()

    # ---------------------------------------------------------------- internals (lock held)

    async def _restart(self, reason: str) -> None:
        await self._terminate()
        if self.supervision.starts:
            self.supervision.restarts.append(reason)
            del self.supervision.restarts[:-RESTART_HISTORY]
            log.warning("wireproxy: restarting (%s)", reason)
        logfile = open(self.config_path.with_suffix(".log"), "ab")
        try:
            self._proc = await process.spawn(
                self.binary, "-c", str(self.config_path), "-i", self.health_address,
                stdin=asyncio.subprocess.DEVNULL, stdout=logfile, stderr=logfile, env=engine_env(os.environ))
        except OSError as err:
            raise EngineError(f"cannot start {self.binary!r}: {err.strerror or err}") from None
        finally:
            logfile.close()
        self.supervision.starts += 1
        self.supervision.health_failures = 0
        self._started_at = time.monotonic()
        self._seen_healthy = False

    async def _check_health(self) -> None:
        answer = await self.get("/readyz", timeout=max(1.0, self.health_interval))
        status = answer[0] if answer is not None else None
        self.supervision.last_health = status
        if status == 200:
            self.supervision.health_failures = 0
            self._seen_healthy = True
            return
        if not self._seen_healthy and time.monotonic() - self._started_at < self.start_grace:
            return  # still starting: the first handshake and pong may take a while
        self.supervision.health_failures += 1
        if self.supervision.health_failures >= self.failures_before_restart:
            what = f"HTTP {status}" if status is not None else "no answer"
            await self._restart(f"/readyz failed {self.supervision.health_failures} times ({what})")

    async def _terminate(self) -> None:
        """SIGTERM, then SIGKILL after STOP_GRACE. ``_proc`` is cleared only once the process is gone,
        so a cancelled caller leaves it for stop() instead of orphaning it."""
        proc = self._proc
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(STOP_GRACE):
                    await proc.wait()
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                with contextlib.suppress(asyncio.TimeoutError):
                    async with asyncio.timeout(STOP_GRACE):
                        await proc.wait()
        self._proc = None
