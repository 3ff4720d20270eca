"""The selection worker: the coordinator's side of the process that does machine selection.

Fetching provider answers, decoding them, building offer tables (about 240 ms at 100,000
offers), filtering, ranking and rendering the answer all run in one separate process
(:mod:`anex_agent.selection.worker_process`), never in the coordinator's: its event loop
only sends a job (the parsed filters, the banned machines, the on-prem node rows) and
receives the rendered answer (the candidates and the per-provider report, as JSON bytes).
The worker's caches (offer tables) live in the worker.

:class:`SelectionWorker`:

* starts the process on the first job (``python -m anex_agent.selection.worker_process``: a
  fresh interpreter, never a fork of the coordinator), at a lower priority (``nice``, default
  10) so that on a machine with few cores the loop wins the CPU;
* when the process dies it logs it and starts a new one; the jobs the dead one held are given
  to the new one once (a second death fails them with :class:`WorkerUnavailable`);
* holds at most ``max_jobs`` jobs at once (:class:`WorkerBusy` beyond), and gives up on a job
  after ``job_timeout`` seconds (:class:`WorkerTimeout`); a job whose caller is cancelled is
  cancelled in the worker too;
* :meth:`aclose` stops the process (end of its input, then SIGTERM, then SIGKILL); the
  process also exits when the coordinator dies (end of input; on Linux, a parent-death
  signal). :meth:`supervise` is a coordinator background task that calls it at shutdown.

:class:`InProcessWorker` runs the same jobs in the caller's process (on a thread); it exists
for unit tests and for callers that are no event loop's owner; the coordinator uses
:class:`SelectionWorker`.

Errors (all :class:`WorkerError`): :class:`WorkerUnavailable` (the process could not start
or died during the job), :class:`WorkerBusy`, :class:`WorkerTimeout`, :class:`JobFailed`
(an unexpected error in the worker; its log says what).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from dataclasses import replace
from typing import Any

from anex_agent.errors import AnexError
from anex_agent.selection.config import SelectionConfig
from anex_agent.selection.worker_process import NODES_PER_FRAME, Engine, Job, encode_frame, read_frame

log = logging.getLogger(__name__)

DEFAULT_NICE = 10
DEFAULT_MAX_JOBS = 64

START_TIMEOUT = 60.0  # seconds for a fresh interpreter to import and answer "ready" on a loaded machine
STOP_TIMEOUT = 3.0


class WorkerError(AnexError):
    """A selection job got no answer from the worker."""


class WorkerUnavailable(WorkerError):
    pass


class WorkerBusy(WorkerError):
    pass


class WorkerTimeout(WorkerError):
    pass


class JobFailed(WorkerError):
    pass


def default_job_timeout(config: SelectionConfig) -> float:
    """Long enough for every attempt of every provider request, their backoff, and the build."""
    policy = config.policy
    return policy.attempts * (policy.timeout + max(policy.max_backoff, policy.max_retry_after)) + 60.0


class SelectionWorker:
    """Runs :class:`~anex_agent.selection.worker_process.Job` s in the worker process (see the module)."""

    def __init__(self, config: SelectionConfig, *, nice: int = DEFAULT_NICE, max_jobs: int = DEFAULT_MAX_JOBS,
                 job_timeout: float | None = None, start_timeout: float = START_TIMEOUT,
                 python: str = sys.executable, log_level: str | None = None) -> None:
        self.config = config
        self.nice = nice
        self.max_jobs = max_jobs
        self.job_timeout = default_job_timeout(config) if job_timeout is None else job_timeout
        self.start_timeout = start_timeout
        self.python = python
        self.log_level = log_level or logging.getLevelName(max(logging.getLogger().getEffectiveLevel(),
                                                               logging.WARNING))
        self.starts = 0  # processes started (for tests and metrics)
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task | None = None
        self._starting: asyncio.Lock | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._next_id = 0
        self._closed = False

    @property
    def pid(self) -> int | None:
        """The worker process's id while one runs."""
        return self._proc.pid if self._proc is not None and self._proc.returncode is None else None

    async def run(self, job: Job) -> bytes:
        """The JSON answer of ``job``, computed in the worker process. When the worker dies before
        answering, the job is given once more to a new one (a job only reads: running it twice
        is harmless); a second death raises :class:`WorkerUnavailable`."""
        if self._closed:
            raise WorkerUnavailable("the coordinator is shutting down")
        if len(self._pending) >= self.max_jobs:
            raise WorkerBusy(f"{len(self._pending)} selections are already being computed")
        self._next_id += 1
        job_id = self._next_id
        proc: asyncio.subprocess.Process | None = None
        deadline = asyncio.get_running_loop().time() + self.job_timeout
        try:
            for last_try in (False, True):
                proc = await self._ensure_started()
                future: asyncio.Future = asyncio.get_running_loop().create_future()
                self._pending[job_id] = future
                try:
                    await self._submit(proc, job_id, job)
                    async with asyncio.timeout_at(deadline):
                        return await asyncio.shield(future)
                except WorkerUnavailable:
                    if last_try or self._closed:
                        raise
                    await self._gone(proc)
                    log.info("selection job %d given to a new selection worker", job_id)
            raise AssertionError("unreachable")
        except TimeoutError:
            if proc is not None:
                await self._cancel(proc, job_id)
            raise WorkerTimeout(f"no answer within {self.job_timeout:g} s") from None
        except asyncio.CancelledError:
            if proc is not None:
                await asyncio.shield(self._cancel(proc, job_id))
            raise
        finally:
            self._pending.pop(job_id, None)

    async def _submit(self, proc: asyncio.subprocess.Process, job_id: int, job: Job) -> None:
        if len(job.nodes) > NODES_PER_FRAME:  # a large fleet: serialized a part per turn of the loop
            for start in range(0, len(job.nodes), NODES_PER_FRAME):
                await self._send(proc, ("nodes", job_id, job.nodes[start:start + NODES_PER_FRAME]))
                await asyncio.sleep(0)
            job = replace(job, nodes=())
        await self._send(proc, ("job", job_id, job))

    async def _gone(self, proc: asyncio.subprocess.Process) -> None:
        """Wait until the reader of ``proc`` (found dead) has finished, so that a new one starts."""
        reader = self._reader
        if proc is self._proc and reader is not None and not reader.done():
            await _stop(proc)
            await asyncio.wait({reader}, timeout=STOP_TIMEOUT)

    async def _cancel(self, proc: asyncio.subprocess.Process, job_id: int) -> None:
        try:
            await self._send(proc, ("cancel", job_id))
        except WorkerUnavailable:
            pass

    async def _send(self, proc: asyncio.subprocess.Process, message: Any) -> None:
        assert proc.stdin is not None
        try:
            proc.stdin.write(encode_frame(message))
            await proc.stdin.drain()
        except (ConnectionError, RuntimeError) as err:  # the process is gone (or its input closed)
            raise WorkerUnavailable(f"the selection worker stopped ({type(err).__name__})") from None

    async def _ensure_started(self) -> asyncio.subprocess.Process:
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._proc is not None and self._proc.returncode is None and self._reader is not None \
                    and not self._reader.done():
                return self._proc
            return await self._start()

    async def _start(self) -> asyncio.subprocess.Process:
        try:
            proc = await asyncio.create_subprocess_exec(
                self.python, "-m", "anex_agent.selection.worker_process", "--parent", str(os.getpid()),
                "--log-level", self.log_level, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                limit=1 << 20)
        except OSError as err:  # the detail is the coordinator's to read, not the caller's
            log.error("the selection worker could not start: %s", err)
            raise WorkerUnavailable("the selection worker could not start; see the coordinator's log") from None
        assert proc.stdout is not None
        try:
            await self._send(proc, ("config", self.config, self.nice))
            async with asyncio.timeout(self.start_timeout):
                ready = await read_frame(proc.stdout)
            if ready[0] != "ready":
                raise EOFError(f"unexpected first message {ready[0]!r}")
        except (EOFError, TimeoutError, WorkerUnavailable) as err:
            await _stop(proc)
            log.error("the selection worker did not start (%s: %s); see its lines on standard error",
                      type(err).__name__, err)
            raise WorkerUnavailable("the selection worker did not start; see the coordinator's log") from None
        except BaseException:
            await _stop(proc)
            raise
        self.starts += 1
        log.info("selection worker started (pid %d)", proc.pid)
        self._proc = proc
        self._reader = asyncio.create_task(self._read(proc), name=f"selection-worker-reader-{proc.pid}")
        return proc

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        """Hand each answer to its job until the process's output ends."""
        assert proc.stdout is not None
        try:
            while True:
                message = await read_frame(proc.stdout)
                future = self._pending.get(message[1])
                if future is None or future.done():
                    continue  # cancelled or timed out meanwhile
                if message[0] == "done":
                    future.set_result(message[2])
                else:
                    future.set_exception(JobFailed(message[2]))
        except EOFError:
            pass
        except Exception:  # a garbled frame: the process is no use any more
            log.exception("selection worker (pid %d) sent something unreadable; stopping it", proc.pid)
        await _stop(proc)
        if not self._closed:
            log.warning("selection worker (pid %d) exited with status %s; a new one starts with the next selection",
                        proc.pid, proc.returncode)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(WorkerUnavailable("the selection worker stopped while answering"))

    async def aclose(self) -> None:
        """Stop the process and fail what it held; later jobs raise :class:`WorkerUnavailable`."""
        self._closed = True
        proc, reader = self._proc, self._reader
        if proc is not None:
            await _stop(proc)
        if reader is not None:
            try:
                async with asyncio.timeout(STOP_TIMEOUT):
                    await reader
            except TimeoutError:
                reader.cancel()
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():  # this caller was cancelled, not only the reader
                    raise

    async def supervise(self) -> None:
        """A coordinator background task: waits, and stops the worker when cancelled (at shutdown)."""
        try:
            await asyncio.Event().wait()
        finally:
            await self.aclose()


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """End the process: close its input (it exits), then SIGTERM, then SIGKILL; reaped either way."""
    if proc.stdin is not None and not proc.stdin.is_closing():
        proc.stdin.close()
    for signal_it in (None, proc.terminate, proc.kill):
        if proc.returncode is not None:
            return
        if signal_it is not None:
            try:
                signal_it()
            except ProcessLookupError:
                pass
        try:
            async with asyncio.timeout(STOP_TIMEOUT):
                await proc.wait()
            return
        except TimeoutError:
            continue


class InProcessWorker:
    """The same jobs in this process (for unit tests; see the module)."""

    def __init__(self, config: SelectionConfig) -> None:
        self.engine = Engine(config)
        self.pid = os.getpid()

    async def run(self, job: Job) -> bytes:
        return await self.engine.answer(job)

    async def aclose(self) -> None:
        await self.engine.aclose()

    async def supervise(self) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await self.aclose()
