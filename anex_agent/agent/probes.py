"""The workload's probes, run next to it as a kubelet runs a container's (:mod:`.probe_spec`).

Contract (one :class:`Prober` per workload; :meth:`Prober.run` once per run of it, a task of
the workload's own TaskGroup, cancelled when the run ends):

* a run starts ``started`` False when there is a startup probe, else True, and ``ready`` False
  when there is a startup or a readiness probe, else True (:meth:`initial`); the state tracker
  carries both in the workload's :class:`~anex_agent.wire.heartbeat.ContainerState`, which the heartbeat
  sends (the pod's ``started``, ``ready`` and its ``Ready`` condition);
* the startup probe runs first, from ``initialDelaySeconds`` after the start, every
  ``periodSeconds``: its first success sets ``started`` (and ``ready`` when there is no
  readiness probe) and starts the others; ``failureThreshold`` failures in a row kill the
  workload;
* the liveness probe: ``failureThreshold`` failures in a row kill the workload (SIGTERM, its
  process group SIGKILLed after the probe's ``terminationGracePeriodSeconds`` or the agent's
  grace period); its restart policy then decides, as for any exit (``Always``/``OnFailure``
  start it again in place and count the restart; ``Never`` ends the pod);
* the readiness probe: ``successThreshold`` successes in a row set ``ready``,
  ``failureThreshold`` failures in a row clear it;
* each decisive failure (readiness turning unready, a liveness or startup kill) is counted in
  the state (``probe_failures``, ``probe_message``: the pod's ``Unhealthy`` Event);
* a check that does not answer within ``timeoutSeconds`` is a failure (an exec probe's process
  group is killed). Any other error of one check (a host that cannot be resolved or encoded, a
  command the system refuses to run) is a failure too, never the end of :meth:`Prober.run`.
  Each failure is logged with its reason, one bounded printable line (the first one of a
  series at INFO, the decisive one at WARNING).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable

from anex_agent.agent.probe_spec import Probe, ProbeSet

log = logging.getLogger(__name__)

OUTPUT_MAX = 512  # bytes of an exec probe's output kept for the log
WHY_MAX = 600  # characters of a failure's reason (logged, and in the pod's Unhealthy Event)
USER_AGENT = "kube-probe/anex-agent"


class Prober:
    def __init__(self, probes: ProbeSet) -> None:
        self.probes = probes

    def initial(self) -> tuple[bool | None, bool | None]:
        """(ready, started) as a run starts; (None, None) without probes (the pod reads: ready once running)."""
        if not self.probes:
            return None, None
        started = self.probes.startup is None
        return started and self.probes.readiness is None, started

    async def run(self, workload) -> None:
        """Probe one run of ``workload`` (a :class:`~anex_agent.agent.workload.Workload`) until cancelled."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        tracker = workload.tracker
        if self.probes.startup is not None:
            if not await self._loop(self.probes.startup, began, workload, self._on_startup(workload)):
                return
            tracker.probed(started=True, ready=True if self.probes.readiness is None else None)
        async with asyncio.TaskGroup() as tg:
            if self.probes.liveness is not None:
                tg.create_task(self._loop(self.probes.liveness, began, workload, self._on_liveness(workload)),
                               name="workload-liveness-probe")
            if self.probes.readiness is not None:
                tg.create_task(self._loop(self.probes.readiness, began, workload, self._on_readiness(workload)),
                               name="workload-readiness-probe")

    # ------------------------------------------------------------ verdicts

    def _on_startup(self, workload) -> Callable[[Probe, bool, int, int, str], bool | None]:
        def verdict(probe: Probe, ok: bool, successes: int, failures: int, why: str) -> bool | None:
            if ok:
                log.info("startup probe (%s) succeeded: the workload has started", probe.describe())
                return True
            if failures >= probe.failure_threshold:
                _kill(workload, probe, failures, why)
                return False
            return None
        return verdict

    def _on_liveness(self, workload) -> Callable[[Probe, bool, int, int, str], bool | None]:
        def verdict(probe: Probe, ok: bool, successes: int, failures: int, why: str) -> bool | None:
            if not ok and failures >= probe.failure_threshold:
                _kill(workload, probe, failures, why)
                return False
            return None
        return verdict

    def _on_readiness(self, workload) -> Callable[[Probe, bool, int, int, str], bool | None]:
        def verdict(probe: Probe, ok: bool, successes: int, failures: int, why: str) -> bool | None:
            ready = workload.tracker.state.ready
            if ok and successes >= probe.success_threshold and ready is not True:
                log.info("readiness probe (%s) succeeded %d time(s): the workload is ready", probe.describe(),
                         successes)
                workload.tracker.probed(ready=True)
            elif not ok and failures >= probe.failure_threshold and ready is not False:
                log.warning("readiness probe (%s) failed %d time(s) (%s): the workload is not ready",
                            probe.describe(), failures, why)
                workload.tracker.probed(ready=False)
                workload.tracker.probe_failed(f"Readiness probe failed: {why}")
            return None
        return verdict

    # ------------------------------------------------------------ the loop and the checks

    async def _loop(self, probe: Probe, began: float, workload,
                    verdict: Callable[[Probe, bool, int, int, str], bool | None]) -> bool:
        """Check ``probe`` every period from its initial delay; the first non-None verdict ends it."""
        loop = asyncio.get_running_loop()
        delay = began + probe.initial_delay - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        successes = failures = 0
        while True:
            ok, why = await check(probe, workload)
            successes, failures = (successes + 1, 0) if ok else (0, failures + 1)
            if not ok and failures == 1:
                log.info("%s probe (%s) failed: %s", probe.kind, probe.describe(), why)
            outcome = verdict(probe, ok, successes, failures, why)
            if outcome is not None:
                return outcome
            await asyncio.sleep(probe.period)


def _kill(workload, probe: Probe, failures: int, why: str) -> None:
    log.warning("%s probe (%s) failed %d time(s) in a row (%s): stopping the workload; its restart policy (%s) "
                "decides whether it runs again", probe.kind, probe.describe(), failures, why,
                workload.restart_policy)
    workload.tracker.probe_failed(f"{probe.kind.capitalize()} probe failed: {why}; the container is stopped and "
                                  f"its restart policy ({workload.restart_policy}) decides")
    workload.kill_unhealthy(probe.grace)


async def check(probe: Probe, workload) -> tuple[bool, str]:
    """One check of ``probe``: (success, why it failed). A check cancelled meanwhile (the run's
    end) raises CancelledError, also when what it awaited lost the cancellation (Python 3.11's
    ``wait_for`` returns the inner result when both come at once): a probe loop that went on
    would keep the workload's stop waiting for ever."""
    try:
        if probe.handler == "exec":
            result = await _exec(probe, workload)
        elif probe.handler == "tcpSocket":
            result = await _tcp(probe)
        else:
            result = await _http(probe)
    except TimeoutError:
        result = False, f"no answer within {probe.timeout:g} s"
    except OSError as err:
        result = False, _why(err.strerror or str(err) or type(err).__name__)
    except Exception as err:  # noqa: BLE001 - any error of one check is that check failing, never the run's end
        result = False, _why(f"{type(err).__name__}: {err}" if str(err) else type(err).__name__)
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
    return result


def _why(text: str) -> str:
    """A failure's reason as one bounded, printable line (it is logged and shown in the pod's Events)."""
    text = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    return text if len(text) <= WHY_MAX else text[:WHY_MAX - 3] + "..."


async def _exec(probe: Probe, workload) -> tuple[bool, str]:
    account = workload.account
    ids = dict(user=account.uid, group=account.gid, extra_groups=list(account.groups)) if account is not None else {}
    proc = await asyncio.create_subprocess_exec(*probe.command, env=workload.env, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                                                process_group=0, **ids)
    try:
        async with asyncio.timeout(probe.timeout):
            output, _ = await proc.communicate()
    except (TimeoutError, asyncio.CancelledError):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        await proc.wait()
        raise
    if proc.returncode == 0:
        return True, ""
    text = output[:OUTPUT_MAX].decode("utf-8", "replace").strip()
    return False, f"exit status {proc.returncode}" + (f": {text}" if text else "")


async def _tcp(probe: Probe) -> tuple[bool, str]:
    async with asyncio.timeout(probe.timeout):
        _reader, writer = await asyncio.open_connection(probe.host, probe.port)
    writer.close()
    try:
        async with asyncio.timeout(probe.timeout):
            await writer.wait_closed()
    except (OSError, TimeoutError):
        pass
    return True, ""


async def _http(probe: Probe) -> tuple[bool, str]:
    import aiohttp

    host = f"[{probe.host}]" if ":" in probe.host else probe.host
    url = f"{probe.scheme.lower()}://{host}:{probe.port}{probe.path}"
    headers = {"User-Agent": USER_AGENT, "Accept": "*/*", **dict(probe.headers)}
    timeout = aiohttp.ClientTimeout(total=probe.timeout)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.get(url, headers=headers, allow_redirects=False,
                                   ssl=False if probe.scheme == "HTTPS" else None) as answer:
                status = answer.status
    except aiohttp.ClientError as err:
        return False, f"GET {url}: {err}"
    if 200 <= status < 400:
        return True, ""
    return False, f"GET {url}: HTTP {status}"
