"""Events about pods, as a kubelet records them (core/v1 Event, the pod as ``involvedObject``; the
legacy form with ``firstTimestamp``/``lastTimestamp``/``count`` that ``kubectl describe`` shows).

:func:`event_object` builds one (pure); :class:`Recorder` creates it through the API and
never raises: an Event is a courtesy to the user, a failure to record one is logged at
debug level (a 403 is logged once by :mod:`.kube`).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from anex_agent.errors import KubeError
from anex_agent.virtualnode.nodeobject import kube_time

log = logging.getLogger(__name__)

COMPONENT = "anex-virtual-node"
MESSAGE_MAX = 1024


def event_object(pod: Mapping[str, Any], kind: str, reason: str, message: str, *, host: str, now: datetime
                 ) -> dict[str, Any]:
    meta = pod.get("metadata") or {}
    name = meta.get("name", "")
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{name}.{secrets.token_hex(8)}", "namespace": meta.get("namespace", "default")},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": meta.get("namespace"),
                           "uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion"),
                           "fieldPath": "spec.containers{%s}" % (((pod.get("spec") or {}).get("containers") or
                                                                   [{}])[0].get("name", ""))},
        "type": kind, "reason": reason, "message": message[:MESSAGE_MAX],
        "source": {"component": COMPONENT, "host": host},
        "firstTimestamp": kube_time(now), "lastTimestamp": kube_time(now), "count": 1,
    }


class Recorder:
    def __init__(self, kube: Any, clock) -> None:
        self.kube = kube
        self.clock = clock  # () -> aware datetime

    async def record(self, pod: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        host = (pod.get("spec") or {}).get("nodeName") or COMPONENT
        body = event_object(pod, kind, reason, message, host=host, now=self.clock())
        try:
            await self.kube.create_event(body["metadata"]["namespace"], body)
        except KubeError as err:
            log.debug("event %s for pod %s not recorded: %s", reason, body["involvedObject"]["name"], err)
