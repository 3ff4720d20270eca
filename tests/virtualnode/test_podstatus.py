"""A provision and its workload to the pod's status (anex_agent.virtualnode.podstatus)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from anex_agent.wire.provisioning import ProvisionView
from anex_agent.virtualnode import podstatus
from anex_agent.virtualnode.podstatus import observe
from anex_agent.wire.heartbeat import ContainerState
from tests.virtualnode.pods import seed

NOW = datetime(2026, 11, 27, 12, 0, 0, tzinfo=timezone.utc)
HOST = "10.0.0.5"


def view(state: str, **extra) -> ProvisionView:
    base = {"id": "pv-1", "name": "vk-1", "state": state, "image": "x", "annotations": {},
            "created_at": NOW - timedelta(minutes=5), "updated_at": NOW}
    return ProvisionView.model_validate({**base, **extra})


RENTED = {"provider": "vastai", "offer_id": "5001", "rental_id": "r-9", "price_per_hour": 0.3}
READY = {**RENTED, "node_id": "n-abc", "address": "10.254.0.7"}


def container(obs):
    return obs.status["containerStatuses"][0]


@pytest.mark.parametrize("state, extra, reason, event", [
    ("selecting", {"reason": "selecting an offer"}, "Selecting", "Selecting"),
    ("renting", RENTED, "Renting", "Renting"),
    ("booting", RENTED, "Booting", "Rented"),
    ("ready", READY, "ContainerCreating", "Booting"),
])
def test_pending_while_selecting_renting_booting(state, extra, reason, event):
    obs = observe(seed(), view(state, **extra), None, host_ip=HOST, now=NOW)
    assert obs.status["phase"] == "Pending" and obs.step == reason
    waiting = container(obs)["state"]["waiting"]
    assert waiting["reason"] == reason and obs.event[1] == event
    assert container(obs)["ready"] is False and obs.status["hostIP"] == HOST
    if state in ("renting", "booting"):
        assert "5001" in waiting["message"] and "$0.3/h" in waiting["message"]


def test_no_provision_yet_is_selecting():
    obs = observe(seed(), None, None, host_ip=HOST, now=NOW)
    assert obs.status["phase"] == "Pending" and obs.step == "Selecting"


def test_running_with_the_mesh_address_as_pod_ip():
    started = NOW - timedelta(seconds=30)
    workload = ContainerState(state="running", started_at=started, restart_count=0)
    obs = observe(seed(), view("ready", **READY), workload, host_ip=HOST, now=NOW)
    status = obs.status
    assert status["phase"] == "Running" and status["podIP"] == "10.254.0.7"
    assert status["podIPs"] == [{"ip": "10.254.0.7"}] and status["hostIP"] == HOST
    assert status["startTime"] == "2026-11-27T11:55:00Z"
    c = container(obs)
    assert c["ready"] and c["started"] and c["restartCount"] == 0 and c["name"] == "training"
    assert c["state"] == {"running": {"startedAt": "2026-11-27T11:59:30Z"}} and c["containerID"] == "anex://n-abc"
    conditions = {x["type"]: x["status"] for x in status["conditions"]}
    assert conditions == {"PodScheduled": "True", "Initialized": "True", "ContainersReady": "True", "Ready": "True"}
    assert obs.event == ("Normal", "Started", obs.event[2]) and "10.254.0.7" in obs.event[2]


@pytest.mark.parametrize("ready, started", [(False, True), (False, False)])
def test_a_running_container_its_probes_call_unready_leaves_the_pod_not_ready(ready, started):
    workload = ContainerState(state="running", started_at=NOW, ready=ready, started=started)
    obs = observe(seed(), view("ready", **READY), workload, host_ip=HOST, now=NOW)
    assert obs.status["phase"] == "Running" and obs.step == "Running"
    c = container(obs)
    assert c["ready"] is False and c["started"] is started and "running" in c["state"]
    conditions = {x["type"]: x for x in obs.status["conditions"]}
    assert conditions["Ready"]["status"] == "False" and conditions["ContainersReady"]["status"] == "False"
    assert conditions["Ready"]["reason"] == "ContainersNotReady" and "[training]" in conditions["Ready"]["message"]
    flipped = observe({**seed(), "status": obs.status}, view("ready", **READY),
                      workload.model_copy(update={"ready": True, "started": True}), host_ip=HOST,
                      now=NOW + timedelta(seconds=7))
    ready_now = {x["type"]: x for x in flipped.status["conditions"]}["Ready"]
    assert ready_now["status"] == "True" and ready_now["lastTransitionTime"] == "2026-11-27T12:00:07Z"
    assert container(flipped)["ready"] is True and container(flipped)["started"] is True


@pytest.mark.parametrize("code, reason, signal, phase", [
    (0, "Completed", None, "Succeeded"), (3, "Error", None, "Failed"), (137, "OOMKilled", 9, "Failed"),
])
def test_terminated_with_exit_code_reason_and_phase(code, reason, signal, phase):
    workload = ContainerState(state="terminated", reason=reason, exit_code=code, signal=signal,
                              started_at=NOW - timedelta(seconds=9), finished_at=NOW - timedelta(seconds=1))
    obs = observe(seed(restartPolicy="Never"), view("ready", **READY), workload, host_ip=HOST, now=NOW)
    assert obs.status["phase"] == phase and obs.step == phase
    terminated = container(obs)["state"]["terminated"]
    assert terminated["exitCode"] == code and terminated["reason"] == reason
    assert terminated["startedAt"] == "2026-11-27T11:59:51Z" and terminated["finishedAt"] == "2026-11-27T11:59:59Z"
    assert terminated.get("signal") == signal
    assert podstatus.is_terminal({"status": obs.status})
    ready = {c["type"]: c for c in obs.status["conditions"]}["Ready"]
    assert ready["status"] == "False" and ready["reason"] == "PodCompleted"
    assert obs.event[0] == ("Normal" if code == 0 else "Warning")


@pytest.mark.parametrize("state, reason", [("failed", "ProvisioningFailed"), ("lost", "MachineLost"),
                                           ("released", "MachineReleased")])
def test_failed_and_lost_provisions_fail_the_pod_with_their_reason(state, reason):
    obs = observe(seed(), view(state, reason="no offer matches: gpu-names removed all"), None, host_ip=HOST, now=NOW)
    assert obs.status["phase"] == "Failed" and obs.status["reason"] == reason
    assert obs.status["message"] == "no offer matches: gpu-names removed all"
    assert obs.event == ("Warning", reason, "no offer matches: gpu-names removed all")


def test_conditions_keep_their_transition_time_while_unchanged():
    pod = seed()
    first = observe(pod, view("selecting"), None, host_ip=HOST, now=NOW).status
    pod["status"] = first
    later = observe(pod, view("renting", **RENTED), None, host_ip=HOST, now=NOW + timedelta(minutes=1)).status
    times = {c["type"]: c["lastTransitionTime"] for c in later["conditions"]}
    assert times["Ready"] == "2026-11-27T12:00:00Z"
    assert times["PodScheduled"] == "2026-11-27T10:00:00Z"  # the scheduler's, kept
    pod["status"] = later
    running = ContainerState(state="running", started_at=NOW)
    moved = observe(pod, view("ready", **READY), running, host_ip=HOST, now=NOW + timedelta(minutes=2)).status
    assert {c["type"]: c["lastTransitionTime"] for c in moved["conditions"]}["Ready"] == "2026-11-27T12:02:00Z"


def test_the_same_inputs_give_the_same_status():
    pod = seed()
    a = observe(pod, view("booting", **RENTED), None, host_ip=HOST, now=NOW).status
    pod["status"] = a
    assert observe(pod, view("booting", **RENTED), None, host_ip=HOST, now=NOW + timedelta(seconds=5)).status == a


def test_a_refused_pod_fails_with_the_reason_and_message():
    status = podstatus.refused(seed(), "UnsupportedPodSpec", "spec.initContainers: not supported", host_ip=HOST,
                               now=NOW)
    assert status["phase"] == "Failed" and status["reason"] == "UnsupportedPodSpec"
    assert status["message"].startswith("spec.initContainers")


def test_a_workload_its_policy_restarts_is_running_in_crash_loop_back_off_with_its_last_run():
    pod = seed()
    pod["spec"]["restartPolicy"] = "OnFailure"
    workload = ContainerState(state="waiting", reason="CrashLoopBackOff", exit_code=3, started_at=NOW - timedelta(
        seconds=9), finished_at=NOW - timedelta(seconds=1), restart_count=2)
    obs = observe(pod, view("ready", **READY), workload, host_ip=HOST, now=NOW)
    assert obs.status["phase"] == "Running" and not podstatus.is_terminal({"status": obs.status})
    assert obs.status["podIP"] == "10.254.0.7"
    c = container(obs)
    assert c["restartCount"] == 2 and not c["ready"] and c["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert c["lastState"] == {"terminated": {"exitCode": 3, "reason": "Error", "startedAt": "2026-11-27T11:59:51Z",
                                             "finishedAt": "2026-11-27T11:59:59Z", "containerID": "anex://n-abc"}}
    assert obs.event[:2] == ("Warning", "BackOff") and obs.step == "BackOff-2"
    ready = {x["type"]: x["status"] for x in obs.status["conditions"]}
    assert ready["Ready"] == "False"
    again = observe(pod, view("ready", **READY), workload.model_copy(update={"restart_count": 3}), host_ip=HOST,
                    now=NOW)
    assert again.step != obs.step  # each back-off is an Event of its own


def test_running_again_after_a_restart_keeps_the_last_runs_end():
    backing_off = ContainerState(state="waiting", reason="CrashLoopBackOff", exit_code=143, started_at=NOW,
                                 finished_at=NOW, restart_count=0)
    first = observe(seed(), view("ready", **READY), backing_off, host_ip=HOST, now=NOW)
    again = observe({**seed(), "status": first.status}, view("ready", **READY),
                    ContainerState(state="running", started_at=NOW, restart_count=1), host_ip=HOST, now=NOW)
    c = container(again)
    assert c["restartCount"] == 1 and c["lastState"]["terminated"]["exitCode"] == 143 and "running" in c["state"]
