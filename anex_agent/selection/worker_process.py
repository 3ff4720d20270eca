"""The selection worker process's side: offer sources and their caches, and the jobs it answers.

Started by the coordinator (:class:`anex_agent.selection.worker.SelectionWorker`) as
``python -m anex_agent.selection.worker_process --parent PID``; it talks over its standard
input and output in frames (:func:`encode_frame`: a 4-byte big-endian length, then a
pickle; both ends are this package, one parent and its child, nothing else writes there):

* in: ``("config", SelectionConfig, nice)`` once, first; then ``("job", id, Job)``, each
  preceded by any number of ``("nodes", id, rows)`` (its on-prem node rows, sent in parts of
  :data:`NODES_PER_FRAME` so that the coordinator never serializes a large fleet in one
  call), and ``("cancel", id)``;
* out: ``("ready", pid)`` once the config is read; then per job ``("done", id, body)`` (the
  JSON answer, bytes) or ``("failed", id, text)`` (an unexpected error, logged here).

The Vast.AI and RunPod sources live here for the life of the process, so their answer caches
(offer tables) do too: the coordinator never holds a table. Each job fetches (through the
cache), builds, filters, ranks and renders its answer here (:class:`Engine`); on-prem nodes
come with the job (the coordinator's database rows), their table is built here too.

The process lowers its priority (``nice``), so on a machine with few cores the coordinator's
loop wins the CPU; it exits when its input ends (the coordinator closed it, or died) and,
on Linux, when its parent dies. Its standard output carries frames only: anything else
printing there goes to standard error.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import pickle
import signal
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from anex_agent.selection import threads
from anex_agent.selection.annotations import Filters
from anex_agent.selection.config import SelectionConfig
from anex_agent.providers.onprem import OnpremSource
from anex_agent.providers.runpod.offers import RunPodSource
from anex_agent.providers.vastai.offers import VastAISource
from anex_agent.selection.service import gather_offers, offers_body, selection_body

log = logging.getLogger("anex_agent.selection.worker")

HEADER = 4  # bytes of frame length
MAX_FRAME = 1 << 30
SELECT, OFFERS = "select", "offers"
NODES_PER_FRAME = 500


def encode_frame(message: Any) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return len(data).to_bytes(HEADER, "big") + data


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The next message; ``EOFError`` when the stream ends (also in the middle of a frame)."""
    try:
        size = int.from_bytes(await reader.readexactly(HEADER), "big")
        if size > MAX_FRAME:
            raise EOFError(f"frame of {size} bytes")
        return pickle.loads(await reader.readexactly(size))
    except asyncio.IncompleteReadError:
        raise EOFError("end of stream") from None


@dataclass(frozen=True)
class Job:
    """One selection (``op`` ``select``) or offer listing (``offers``), everything it needs.

    ``providers``: the configured sources to ask, in order (``onprem`` among them asks the
    ``nodes``); ``report``: per provider asked for but not configured, what to say about it;
    ``nodes``: the on-prem nodes (:func:`~anex_agent.providers.onprem.offer_from_node`'s
    shape, ``labels`` and ``telemetry`` may be JSON text).
    """

    op: str
    filters: Filters
    providers: tuple[str, ...]
    report: Mapping[str, Any] = field(default_factory=dict)
    banned: frozenset[str] = frozenset()
    limit: int = 10
    ordering: str = "price"
    nodes: Sequence[Mapping[str, Any]] = ()


class Engine:
    """The sources (with their caches) and the jobs over them. Lives in the worker process (or,
    for unit tests only, in the caller's: :class:`anex_agent.selection.worker.InProcessWorker`)."""

    def __init__(self, config: SelectionConfig) -> None:
        self.config = config
        self.sources: dict[str, Any] = {}
        if config.vastai is not None:
            self.sources["vastai"] = VastAISource(config.vastai)
        if config.runpod is not None:
            self.sources["runpod"] = RunPodSource(config.runpod)

    async def aclose(self) -> None:
        for source in self.sources.values():
            await source.aclose()

    async def answer(self, job: Job) -> bytes:
        """The JSON body of ``job``'s answer."""
        sources = []
        for name in job.providers:
            if name == "onprem":
                sources.append(OnpremSource(functools.partial(_listed, job.nodes),
                                            default_policy=self.config.qualification))
            elif name in self.sources:
                sources.append(self.sources[name])
        table, report = await gather_offers(sources, job.filters)
        report = {**report, **job.report}
        if job.op == SELECT:
            return await threads.run(selection_body, table, job.filters, job.banned, job.limit, job.ordering, report)
        if job.op == OFFERS:
            return await threads.run(offers_body, table, job.filters, job.limit, report, sorted(job.banned))
        raise ValueError(f"unknown job {job.op!r}")


async def _listed(nodes: Sequence[Mapping[str, Any]]) -> Sequence[Mapping[str, Any]]:
    return nodes


# ------------------------------------------------------------------ the process


async def serve(reader: asyncio.StreamReader, out_fd: int) -> None:
    """Answer jobs until the input ends; each job is a named task, cancelled on ``cancel`` or at the end."""
    first = await read_frame(reader)
    if first[0] != "config":
        raise SystemExit("selection worker: the first message must be the configuration")
    _, config, nice = first
    if nice:
        os.nice(nice)
    engine = Engine(config)
    jobs: dict[int, asyncio.Task] = {}
    staged: dict[int, list] = {}  # job id -> its on-prem node rows received so far

    def send(message: Any) -> None:
        data = memoryview(encode_frame(message))
        while data:  # the coordinator reads all the time: blocking here is short
            data = data[os.write(out_fd, data):]

    async def run(job_id: int, job: Job) -> None:
        try:
            body = await engine.answer(job)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            log.exception("selection job failed")
            send(("failed", job_id, f"{type(err).__name__}: {err}"))
        else:
            send(("done", job_id, body))
        finally:
            jobs.pop(job_id, None)

    send(("ready", os.getpid()))
    try:
        async with asyncio.TaskGroup() as group:
            while True:
                try:
                    message = await read_frame(reader)
                except EOFError:
                    break
                if message[0] == "nodes":
                    staged.setdefault(message[1], []).extend(message[2])
                elif message[0] == "job":
                    job = message[2]
                    if message[1] in staged:
                        job = replace(job, nodes=(*staged.pop(message[1]), *job.nodes))
                    jobs[message[1]] = group.create_task(run(message[1], job), name=f"selection-job-{message[1]}")
                elif message[0] == "cancel":
                    staged.pop(message[1], None)
                    if message[1] in jobs:
                        jobs[message[1]].cancel()
            for task in list(jobs.values()):  # input ended: nobody waits for these answers
                task.cancel()
    finally:
        await engine.aclose()


def _die_with_parent(parent: int) -> None:
    """Linux: SIGTERM when the parent dies (and exit now if it already has)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # elsewhere: the end of the input stops the worker
    if parent and os.getppid() != parent:
        raise SystemExit(0)


async def _main(out_fd: int) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    await serve(reader, out_fd)


def main(argv: Sequence[str] | None = None) -> None:
    out_fd = os.dup(1)  # frames go here; fd 1 (print, stray output) goes to standard error
    os.dup2(2, 1)
    parser = argparse.ArgumentParser(description="machine selection worker of the anex-agent coordinator "
                                                 "(started by the coordinator; not for direct use)")
    parser.add_argument("--parent", type=int, default=0)
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    _die_with_parent(args.parent)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s selection-worker[%(process)d] %(name)s: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the coordinator: it stops us
    try:
        asyncio.run(_main(out_fd))
    except (EOFError, BrokenPipeError):
        pass


if __name__ == "__main__":
    main()
