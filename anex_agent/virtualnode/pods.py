"""Pods bound to the virtual nodes -> provisions, and their status back, as a kubelet would.

What it keeps (in memory, rebuilt from the API server and the coordinator at every start):
the pods bound to our Nodes (a list then a watch per Node, ``spec.nodeName`` field selector),
our provisions (the coordinator's ``/v1/provisions/watch``: a snapshot, then each change), and
the workload state of each ready provision's node (``GET /v1/nodes/{id}`` every
``poll_interval``, only for pods still running). Every change queues the pod's uid; workers
sync one pod at a time (:class:`~.workqueue.WorkQueue`), so a pod is never handled twice at once.

Syncing a pod:

* **new or running**: our finalizer (``anex.sh/provision``) is added first, so a deletion waits
  for us; a pod without a provision gets one (:mod:`.podspec`: refused pods fail at once, with
  the field named, and nothing is rented; a 400/422 of the coordinator fails the pod with its
  message; another failure, a 503 or no answer, is a Warning Event ``ProvisioningDelayed`` once
  and a retry); once its machine is ready, the pod's files (ConfigMap and Secret volumes) and its
  variables from Secrets are pushed through the coordinator to the agent, which holds the
  workload until they are in (:meth:`PodController._deliver`); every ``volume_refresh`` seconds
  a running pod's volumes are read again and a changed file pushed (:meth:`PodController._refresh`;
  after a restart of ours, a running pod's volumes are all pushed again at the first refresh);
  the status is written (:mod:`.podstatus`) and an Event recorded for each new step, and an
  ``Unhealthy`` Event for each probe decision the agent reports.
* **Succeeded or Failed**: the provision is deleted (the machine is released; the pod stays).
* **being deleted**: the provision is deleted (an Event ``Killing``) and, once the coordinator
  says ``deleted`` (the rental destroyed, the node removed), the finalizer is removed and the
  pod deleted with grace 0: no kubelet will confirm it, and nothing is left running.
* **gone** (deleted from the API): its provision, if any, is deleted.

The provision's name is ``<provision prefix><pod uid>`` (``POST`` is idempotent by name): a
restarted virtual node finds the provision it made and never rents twice. Once both the pods
and the provisions are listed, provisions of ours whose pod no longer exists are deleted.
A failed call is logged in one line and the pod synced again with backoff (up to 30 s).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from anex_agent.wire import pod as pod_wire
from anex_agent.backoff import Backoff
from anex_agent.errors import CoordinatorError, KubeError
from anex_agent.wire.provisioning import ProvisionState, ProvisionView
from anex_agent.virtualnode import podfiles, podspec, podstatus
from anex_agent.virtualnode.events import Recorder
from anex_agent.virtualnode.kube import MERGE_PATCH
from anex_agent.virtualnode.metrics import PodMetrics, failure_reason
from anex_agent.virtualnode.workqueue import WorkQueue
from anex_agent.wire.heartbeat import ContainerState

log = logging.getLogger(__name__)

FINALIZER = "anex.sh/provision"
RECONCILE = "<reconcile>"  # the queue key of the orphan sweep
RETRY_BASE = 0.5
RETRY_CAP = 30.0
GONE = (ProvisionState.deleting, ProvisionState.deleted)


def _meta(pod: dict[str, Any]) -> dict[str, Any]:
    return pod.get("metadata") or {}


class PodController:
    def __init__(self, settings: Any, kube: Any, coordinator: Any, clock: Callable[[], datetime],
                 node_names: list[str], metrics: PodMetrics | None = None) -> None:
        self.settings = settings
        self.kube = kube
        self.coordinator = coordinator
        self.clock = clock
        self.node_names = list(node_names)
        self.recorder = Recorder(kube, clock)
        self.queue = WorkQueue()
        self.pods: dict[str, dict[str, Any]] = {}  # uid -> pod
        self.provisions: dict[str, ProvisionView] = {}  # provision name -> its latest view
        self.workloads: dict[str, ContainerState | None] = {}  # provision id -> its node's workload state
        self.steps: dict[str, str] = {}  # uid -> the step whose Event was recorded
        self.written: dict[str, dict[str, Any]] = {}  # uid -> the status last written
        self.delivered: set[str] = set()  # uids whose files reached their machine (or need none there)
        self.volumes: dict[str, dict[str, str]] = {}  # uid -> path -> digest of the volume file pushed there
        self.refresh_due: set[str] = set()  # uids whose volumes are read again at their next sync
        self.probe_failures: dict[str, int] = {}  # uid -> the agent's probe_failures an Event was recorded for
        self.synced_nodes: set[str] = set()
        self.provisions_synced = False
        self.snapshot_seen = asyncio.Event()  # the first provisions snapshot is in
        self.pods_listed = asyncio.Event()  # every Node's pods are listed
        self._retries: dict[str, Backoff] = {}
        self.metrics = metrics if metrics is not None else PodMetrics()  # served with --metrics-listen
        self.metrics.watch_pods(lambda: self.pods)

    # ------------------------------------------------------------ what the caches hold

    def uid_of(self, view: ProvisionView) -> str | None:
        return podspec.pod_uid_of(self.settings.provision_prefix, view.name)

    def remember(self, view: ProvisionView) -> None:
        """Keep ``view`` unless an answer already newer is kept (the watch and POST answers race)."""
        old = self.provisions.get(view.name)
        if old is None or old.id != view.id or view.updated_at >= old.updated_at:
            self.provisions[view.name] = view

    def view_of(self, uid: str) -> ProvisionView | None:
        return self.provisions.get(podspec.provision_name(self.settings.provision_prefix, uid))

    def forget(self, uid: str) -> None:
        self.metrics.forget(uid)
        self.steps.pop(uid, None)
        self.written.pop(uid, None)
        self.delivered.discard(uid)
        self.volumes.pop(uid, None)
        self.refresh_due.discard(uid)
        self.probe_failures.pop(uid, None)
        view = self.provisions.pop(podspec.provision_name(self.settings.provision_prefix, uid), None)
        if view is not None:
            self.workloads.pop(view.id, None)

    # ------------------------------------------------------------ sources of changes

    async def watch_node_pods(self, node: str) -> None:
        """List, then watch, the pods bound to ``node``, for ever (errors: one line, backoff, list again)."""
        selector = f"spec.nodeName={node}"
        backoff = Backoff(base=1.0, cap=RETRY_CAP)
        while True:
            try:
                listed = await self.kube.list_pods(selector)
                version = (listed.get("metadata") or {}).get("resourceVersion", "")
                seen = set()
                for pod in listed.get("items") or []:
                    uid = _meta(pod).get("uid")
                    if uid:
                        seen.add(uid)
                        self.pods[uid] = pod
                        self.queue.add(uid)
                for uid, pod in list(self.pods.items()):
                    if (pod.get("spec") or {}).get("nodeName") == node and uid not in seen:
                        del self.pods[uid]  # deleted while we were not watching
                        self.queue.add(uid)
                self.synced_nodes.add(node)
                if not set(self.node_names) - self.synced_nodes:
                    self.pods_listed.set()
                self.queue.add(RECONCILE)
                backoff.reset()
                while True:
                    async for kind, pod in self.kube.watch_pods(selector, version):
                        uid = _meta(pod).get("uid")
                        version = _meta(pod).get("resourceVersion") or version
                        if not uid:
                            continue
                        if kind == "DELETED":
                            self.pods.pop(uid, None)
                        else:
                            self.pods[uid] = pod
                        self.queue.add(uid)
            except KubeError as err:
                if err.status == 410:  # our resourceVersion is too old: list again
                    continue
                delay = backoff.next_delay()
                log.warning("pods of node %s: %s; listing again in %.1f s", node, err, delay)
                await asyncio.sleep(delay)

    async def watch_provisions(self) -> None:
        """Follow the coordinator's provisions (errors: one line, backoff, watch again)."""
        backoff = Backoff(base=1.0, cap=RETRY_CAP)
        while True:
            try:
                async for event in self.coordinator.watch_provisions():
                    backoff.reset()
                    if event.type == "snapshot":
                        self._snapshot(event.provisions or [])
                    elif event.provision is not None and self.uid_of(event.provision):
                        self.remember(event.provision)
                        self.queue.add(self.uid_of(event.provision))
            except CoordinatorError as err:  # not retryable (401, 403): the admin token is refused
                delay = backoff.next_delay()
                log.error("the provisions watch stopped: %s; the admin token may be wrong; again in %.1f s", err, delay)
                await asyncio.sleep(delay)

    def _snapshot(self, views: list[ProvisionView]) -> None:
        ours = {v.name: v for v in views if self.uid_of(v)}
        for name in [n for n in self.provisions if n not in ours]:
            gone = self.provisions.pop(name)  # deleted while we were not watching
            self.provisions[name] = gone.model_copy(update={"state": ProvisionState.deleted})
            self.queue.add(self.uid_of(gone))
        for view in ours.values():
            self.provisions[view.name] = view
            self.queue.add(self.uid_of(view))
        for uid in self.pods:
            self.queue.add(uid)
        self.provisions_synced = True
        self.snapshot_seen.set()
        self.queue.add(RECONCILE)

    async def poll_workloads(self) -> None:
        """Read the node view of every ready provision whose pod still runs; queue the pods whose state changed."""
        while True:
            await asyncio.sleep(self.settings.poll_interval)
            for view in list(self.provisions.values()):
                uid = self.uid_of(view)
                pod = self.pods.get(uid or "")
                if view.state != ProvisionState.ready or not view.node_id or pod is None or podstatus.is_terminal(pod):
                    continue
                try:
                    if await self._read_workload(view):
                        self.queue.add(uid)
                except CoordinatorError as err:
                    log.debug("node %s of provision %s not read: %s", view.node_id, view.name, err)

    async def _read_workload(self, view: ProvisionView) -> bool:
        """Read the workload state of ``view``'s node; True when it changed."""
        node = await self.coordinator.get_node(view.node_id)
        state = node.status.workload if node.status is not None else None
        changed = view.id not in self.workloads or state != self.workloads[view.id]
        self.workloads[view.id] = state
        return changed

    # ------------------------------------------------------------ workers

    async def worker(self) -> None:
        while True:
            key = await self.queue.get()
            try:
                await self.sync(key)
                self._retries.pop(key, None)
            except (KubeError, CoordinatorError) as err:
                delay = self._retries.setdefault(key, Backoff(base=RETRY_BASE, cap=RETRY_CAP)).next_delay()
                log.warning("pod %s: %s; trying again in %.1f s", self._label(key), err, delay)
                self.queue.add_after(key, delay)
            except Exception:
                delay = self._retries.setdefault(key, Backoff(base=RETRY_BASE, cap=RETRY_CAP)).next_delay()
                log.exception("pod %s: syncing failed; trying again in %.1f s", self._label(key), delay)
                self.queue.add_after(key, delay)
            finally:
                self.queue.done(key)

    def _label(self, key: str) -> str:
        pod = self.pods.get(key)
        return f"{_meta(pod).get('namespace')}/{_meta(pod).get('name')}" if pod else key

    async def sync(self, key: str) -> None:
        if key == RECONCILE:
            await self.reconcile()
            return
        if not self.provisions_synced:
            return  # the first snapshot queues every pod again
        pod = self.pods.get(key)
        view = self.view_of(key)
        if pod is None:
            if set(self.node_names) - self.synced_nodes:
                return  # not every Node's pods are listed yet: "no pod" may only mean "not seen yet"
            if view is not None and view.state not in GONE:
                log.info("pod %s is gone: deleting its provision %s", key, view.id)
                await self._delete_provision(view, None)
            elif view is None or view.state == ProvisionState.deleted:
                self.forget(key)
            return
        if _meta(pod).get("deletionTimestamp"):
            await self._finish_deletion(pod, view)
            return
        if podstatus.is_terminal(pod):
            if view is not None and view.state not in GONE:
                await self._delete_provision(view, None)  # the pod ended: release the machine
            return
        if FINALIZER not in (_meta(pod).get("finalizers") or []):
            patched = await self._set_finalizers(pod, [*(_meta(pod).get("finalizers") or []), FINALIZER])
            if patched is None:
                return
            pod = self.pods[key] = patched
        if view is None:
            await self._create(pod)
            return
        if view.state == ProvisionState.ready and view.node_id and view.id not in self.workloads:
            await self._read_workload(view)  # first sight of it (a restart): never report Running as Pending
        if view.state == ProvisionState.ready and view.node_id and key not in self.delivered:
            if not await self._deliver(pod, view):
                return
        if key in self.refresh_due and view.state == ProvisionState.ready and view.node_id:
            self.refresh_due.discard(key)
            await self._refresh(pod, view)
        observation = podstatus.observe(pod, view, self.workloads.get(view.id), host_ip=self.settings.internal_ip,
                                        now=self.clock())
        await self._write_status(pod, observation.status)
        if observation.event is not None and self.steps.get(key) != observation.step:
            self.steps[key] = observation.step
            await self.recorder.record(pod, *observation.event)
        workload = self.workloads.get(view.id)
        if workload is not None and workload.probe_failures > self.probe_failures.get(key, 0):
            self.probe_failures[key] = workload.probe_failures  # a kubelet's Unhealthy Event
            await self.recorder.record(pod, podstatus.WARNING, "Unhealthy", workload.probe_message)

    async def reconcile(self) -> None:
        """Delete our provisions whose pod no longer exists (once pods and provisions are listed)."""
        if not self.provisions_synced or set(self.node_names) - self.synced_nodes:
            return
        for view in list(self.provisions.values()):
            uid = self.uid_of(view)
            if uid and uid not in self.pods and view.state not in GONE:
                log.info("provision %s (%s) belongs to no pod of this cluster any more: deleting it", view.name, view.id)
                await self._delete_provision(view, None)

    # ------------------------------------------------------------ steps

    async def _create(self, pod: dict[str, Any]) -> None:
        meta = _meta(pod)
        namespace = meta.get("namespace", "default")
        objects: dict[tuple[str, str], dict[str, str] | None] = {}
        for kind, name in podspec.fetched(pod):
            raw = await (self.kube.get_secret if kind == "secret" else self.kube.get_config_map)(namespace, name)
            objects[(kind, name)] = podspec.object_data(kind, raw)
        try:
            translation = podspec.translate(pod, objects, prefix=self.settings.provision_prefix)
        except podspec.Refusal as refusal:
            await self._fail(pod, "UnsupportedPodSpec", str(refusal))
            return
        try:
            view = await self.coordinator.create_provision(translation.spec)
        except CoordinatorError as err:
            if err.status in (400, 422):
                await self._fail(pod, "ProvisioningRefused", f"the coordinator refused the pod: {_problem_text(err)}")
                return
            if err.status != 409:
                if self.steps.get(meta["uid"]) != "Delayed":  # said once; the worker retries with backoff
                    self.steps[meta["uid"]] = "Delayed"
                    await self.recorder.record(pod, podstatus.WARNING, "ProvisioningDelayed",
                                               f"the coordinator cannot take the pod yet: {err}; trying again")
                raise
            # another body under our name: the pod's env changed since (a Secret); the provision stands
            listed = await self.coordinator.list_provisions()
            view = next((v for v in listed.provisions if v.name == translation.spec.name), None)
            if view is None:
                raise
        else:
            self.metrics.provisions_created.inc()
        log.info("pod %s/%s: provision %s (%s)", namespace, meta.get("name"), view.name, view.id)
        self.remember(view)
        for warning in translation.warnings:
            await self.recorder.record(pod, podstatus.WARNING, "NotCarried", warning)
        self.queue.add(meta["uid"])

    async def _deliver(self, pod: dict[str, Any], view: ProvisionView) -> bool:
        """Push the pod's files (ConfigMap and Secret volumes) and its variables from Secrets to its
        machine through the coordinator (which stores none of them), then the mark that lets the agent
        start the workload; once per pod. False when the pod failed instead (an object gone since)."""
        meta = _meta(pod)
        uid, namespace = meta["uid"], meta.get("namespace", "default")
        workload = self.workloads.get(view.id)
        started = workload is not None and not (workload.state == "waiting" and workload.reason == "ContainerCreating")
        if not podspec.delivers(pod) or started:  # nothing to push, or pushed before a restart of ours
            if started and podfiles.references(pod):
                self.volumes.setdefault(uid, {})  # what was pushed is not known: the next refresh pushes them all
            self.delivered.add(uid)
            return True
        raw: dict[tuple[str, str], dict[str, Any] | None] = {}
        for kind, name in podspec.references(pod):
            raw[(kind, name)] = await (self.kube.get_secret if kind == "secret" else self.kube.get_config_map)(
                namespace, name)
        try:
            files = podfiles.files(pod, raw)
            variables = podspec.delivered_env(pod, {k: podspec.object_data(k[0], v) for k, v in raw.items()})
        except podspec.Refusal as refusal:
            await self._fail(pod, "FailedMount", str(refusal))
            return False
        for file in files:
            await self.coordinator.push_file(view.node_id, file.path, file.data, file.mode)
        if files:
            self.volumes[uid] = {file.path: _digest(file) for file in files}
        if variables is not None:
            await self.coordinator.push_file(view.node_id, pod_wire.ENV_FILE,
                                             json.dumps(variables).encode(), 0o600)
        await self.coordinator.push_file(view.node_id, pod_wire.COMPLETE, b"", 0o600)
        self.delivered.add(uid)
        log.info("pod %s/%s: %d file(s) and %d variable(s) delivered to node %s", namespace,
                 meta.get("name"), len(files), len(variables or ()), view.node_id)
        return True

    async def refresh_volumes(self) -> None:
        """Every ``volume_refresh`` seconds, queue the running pods whose volume files were pushed:
        their sync reads the ConfigMaps and Secrets again and pushes what changed (:meth:`_refresh`)."""
        while True:
            await asyncio.sleep(self.settings.volume_refresh)
            for uid in list(self.volumes):
                pod = self.pods.get(uid)
                if pod is not None and not podstatus.is_terminal(pod) and not _meta(pod).get("deletionTimestamp"):
                    self.refresh_due.add(uid)
                    self.queue.add(uid)

    async def _refresh(self, pod: dict[str, Any], view: ProvisionView) -> None:
        """Push the pod's volume files whose content or mode changed since they were pushed (a file
        whose key went away stays as it was, as does every file while an object is missing)."""
        meta = _meta(pod)
        uid, namespace = meta["uid"], meta.get("namespace", "default")
        raw: dict[tuple[str, str], dict[str, Any] | None] = {}
        for kind, name in podfiles.references(pod):
            raw[(kind, name)] = await (self.kube.get_secret if kind == "secret" else self.kube.get_config_map)(
                namespace, name)
        try:
            files = podfiles.files(pod, raw)
        except podspec.Refusal as refusal:
            log.info("pod %s/%s: its volumes are left as they are: %s", namespace, meta.get("name"), refusal)
            return
        pushed = self.volumes.setdefault(uid, {})
        changed = [file for file in files if pushed.get(file.path) != _digest(file)]
        for file in changed:
            await self.coordinator.push_file(view.node_id, file.path, file.data, file.mode)
            pushed[file.path] = _digest(file)
        if changed:
            log.info("pod %s/%s: %d volume file(s) updated on node %s", namespace, meta.get("name"), len(changed),
                     view.node_id)

    async def _fail(self, pod: dict[str, Any], reason: str, message: str) -> None:
        meta = _meta(pod)
        log.info("pod %s/%s fails: %s", meta.get("namespace"), meta.get("name"), message)
        status = podstatus.refused(pod, reason, message, host_ip=self.settings.internal_ip, now=self.clock())
        await self._write_status(pod, status)
        await self.recorder.record(pod, podstatus.WARNING, reason, message)

    async def _write_status(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        uid = _meta(pod)["uid"]
        if self.written.get(uid) == status:
            return
        meta = _meta(pod)
        updated = await self.kube.patch_pod_status(meta.get("namespace"), meta.get("name"), status)
        self.written[uid] = status
        self.metrics.phase_written(uid, status.get("phase") or "Pending", failure_reason(status))
        if updated is not None and uid in self.pods:
            self.pods[uid] = updated

    async def _set_finalizers(self, pod: dict[str, Any], finalizers: list[str]) -> dict[str, Any] | None:
        """Write the pod's finalizers (merge patch guarded by its resourceVersion: a 409 retries)."""
        meta = _meta(pod)
        patch = {"metadata": {"finalizers": finalizers or None, "resourceVersion": meta.get("resourceVersion")}}
        return await self.kube.patch_pod(meta.get("namespace"), meta.get("name"), patch, content_type=MERGE_PATCH)

    async def _delete_provision(self, view: ProvisionView, pod: dict[str, Any] | None) -> None:
        try:
            deleted = await self.coordinator.delete_provision(view.id)
        except CoordinatorError as err:
            if err.status != 404:
                raise
            deleted = view.model_copy(update={"state": ProvisionState.deleted})
        else:
            self.metrics.provisions_deleted.inc()
        self.remember(deleted)
        if pod is not None:
            await self.recorder.record(pod, podstatus.NORMAL, "Killing",
                                       f"stopping the container: deleting provision {view.id} (the rental is "
                                       "destroyed, the node removed)")

    async def _finish_deletion(self, pod: dict[str, Any], view: ProvisionView | None) -> None:
        meta = _meta(pod)
        if view is not None and view.state != ProvisionState.deleted:
            if view.state != ProvisionState.deleting:
                await self._delete_provision(view, pod)
            return  # its next change (deleted) queues the pod again
        if FINALIZER in (meta.get("finalizers") or []):
            patched = await self._set_finalizers(pod, [f for f in meta["finalizers"] if f != FINALIZER])
            if patched is None:
                return
        if await self.kube.delete_pod(meta.get("namespace"), meta.get("name"), meta["uid"], grace=0):
            log.info("pod %s/%s deleted: nothing of it is left rented", meta.get("namespace"), meta.get("name"))


def _digest(file: podfiles.PodFile) -> str:
    return hashlib.sha256(file.mode.to_bytes(2, "big") + file.data).hexdigest()


def _problem_text(err: CoordinatorError) -> str:
    """The coordinator's problem: its detail and each field's message (``annotations.anex.sh/x: ...``)."""
    problem = err.problem or {}
    detail = str(problem.get("detail") or problem.get("title") or err)
    fields = [f"{e.get('field')}: {e.get('message')}" for e in problem.get("errors") or [] if isinstance(e, dict)]
    return "; ".join([detail, *fields])
