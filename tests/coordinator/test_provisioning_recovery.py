"""Provisioning that recovers by itself (SQLite and PostgreSQL, the in-memory rental provider):
the retry policy (events, window, backoff; exactly the attempts it allows, never two rentals
alive for one provision), boot phase deadlines (running, join, heartbeat, rent), interruptible
capacity outbid and replaced, a GPU fault (XID 79) banning the machine and re-provisioning, the
idle release, and a coordinator stopped mid-retry resumed by another without a second rental.

Time is the coordinator's clock (:class:`ShiftClock`): a test moves it past a deadline or a
backoff instead of waiting.
"""

from __future__ import annotations

import dataclasses

import pytest

from anex_agent.wire.heartbeat import ContainerState, Heartbeat, TransportStatus
from anex_agent.coordinator.provisioning import policy as policy_mod
from anex_agent.coordinator.provisioning.policy import PolicyDefaults, RecoveryPolicy, parse_policy
from anex_agent.coordinator.routes.provisions import provisioner_of
from anex_agent.errors import ConfigError
from anex_agent.selection.annotations import AnnotationError, parse_annotations
from anex_agent.selection.bans import BanStore
from anex_agent.telemetry.models import Telemetry
from tests.coordinator.conftest import stop_harness
from tests.coordinator.provisioning_fakes import FAST, FakeRentals, FakeSelector, ShiftClock, boot_node, offers, start
from tests.coordinator.test_provisioning import SPEC, Api
from tests.polling import wait_until

#: retries wait 30-60 s (one Backoff, equal jitter, capped at 60 s); boot overall cap far away
RETRY = dataclasses.replace(FAST, boot_timeout=900, policy=RecoveryPolicy(backoff=60, backoff_max=60))


@pytest.fixture
def shift() -> ShiftClock:
    return ShiftClock()


def spec(**annotations: str) -> dict:
    return {**SPEC, "annotations": {**SPEC["annotations"], **annotations}}


# ---------------------------------------------------------------------- parsing


def test_policy_annotations_parse_and_name_the_bad_one():
    p = parse_policy({"anex.sh/retry-on": "no-capacity, interruption", "anex.sh/retry-for": "2h",
                      "anex.sh/deadline-join": "30s", "anex.sh/interruptible": "true",
                      "anex.sh/idle-release": "30m", "anex.sh/idle-threshold": "10"})
    assert p.retry_on == {"no-capacity", "interruption"} and p.retry_for == 7200
    assert p.deadline("join") == 30 and p.deadline("running") == 150 and p.interruptible
    assert p.idle_release == 1800 and p.idle_threshold == 10
    assert parse_policy({}).retry_on == frozenset() and parse_policy({}).idle_release is None
    with pytest.raises(AnnotationError) as err:
        parse_policy({"anex.sh/retry-on": "sometimes", "anex.sh/retry-for": "forever",
                       "anex.sh/interruptible": "yes"})
    named = {p.annotation: p.message for p in err.value.problems}
    assert set(named) == {"anex.sh/retry-on", "anex.sh/retry-for", "anex.sh/interruptible"}
    assert "no-capacity, error, interruption" in named["anex.sh/retry-on"]
    # the selection leaves these names to the provisioning loop
    parse_annotations({"anex.sh/retry-on": "error", "anex.sh/deadline-running": "2m"})
    assert policy_mod.NAMES == {"retry-on", "retry-for", "interruptible", "idle-release", "idle-threshold"} | {
        f"deadline-{p}" for p in policy_mod.PHASES}


def test_policy_defaults_from_env_name_the_variable():
    d = PolicyDefaults.from_env({"ANEX_PROVISION_RETRY_ON": "error", "ANEX_PROVISION_DEADLINE_RUNNING": "2m",
                                 "ANEX_PROVISION_IDLE_RELEASE": "1h"}).policy
    assert d.retry_on == {"error"} and d.deadline("running") == 120 and d.idle_release == 3600
    assert parse_policy({"anex.sh/retry-on": "none"}, d).retry_on == frozenset()
    with pytest.raises(ConfigError, match="ANEX_PROVISION_RETRY_FOR"):
        PolicyDefaults.from_env({"ANEX_PROVISION_RETRY_FOR": "soon"})
    with pytest.raises(ConfigError, match="ANEX_PROVISION_RETRY_ON"):
        PolicyDefaults.from_env({"ANEX_PROVISION_RETRY_ON": "always"})


def test_backoff_is_one_backoff_with_equal_jitter():
    p = RecoveryPolicy(backoff=30, backoff_max=600)
    for n, ceiling in ((0, 30), (1, 60), (3, 240), (10, 600)):
        assert ceiling / 2 <= p.delay(n) <= ceiling


def test_provider_status_and_gpu_faults_are_read_as_documented():
    from anex_agent.coordinator.provisioning import recovery
    from anex_agent.providers.rentals import Rental
    from anex_agent.providers.runpod.rentals import rental_from_pod
    from anex_agent.providers.vastai.rentals import rental_from_instance

    def vast(**raw) -> Rental:
        return rental_from_instance({"id": 1, "label": "l", "cur_state": "running", "intended_status": "running",
                                     **raw})

    loading = vast(actual_status="loading")
    assert not recovery.running(loading) and recovery.interrupted(loading) is None
    assert not recovery.running(vast())  # the contract says running, the machine does not yet
    assert recovery.running(vast(actual_status="running"))
    outbid = vast(actual_status="exited", intended_status="stopped", cur_state="stopped", status_msg="outbid")
    assert "outbid" in recovery.interrupted(outbid)
    assert recovery.interrupted(rental_from_pod({"id": "p", "name": "l", "desiredStatus": "EXITED"}))
    assert recovery.running(rental_from_pod({"id": "p", "name": "l", "desiredStatus": "RUNNING"}))
    for xid in (48, 63, 64, 79):
        assert f"XID {xid}" in recovery.gpu_fault({"telemetry": _telemetry(last_xid=xid).as_sent_json()})
    assert recovery.gpu_fault({"telemetry": _telemetry(last_xid=13).as_sent_json(), "health": "healthy"}) is None
    assert "reset_required" in recovery.gpu_fault({"telemetry": _telemetry(state="reset_required").as_sent_json()})
    assert "unhealthy" in recovery.gpu_fault({"telemetry": None, "health": "unhealthy",
                                              "health_reasons": '["nvml: gpu_lost"]'})
    assert recovery.idle({"telemetry": _telemetry(gpu_util_pct=3).as_sent_json()}, 5) is True
    assert recovery.idle({"telemetry": _telemetry(gpu_util_pct=30).as_sent_json()}, 5) is False
    assert recovery.idle({"telemetry": _telemetry().as_sent_json()}, 5) is None


def test_interruptible_rent_bodies():
    from anex_agent.providers.rentals import RentRequest
    from anex_agent.providers.runpod.rentals import create_body, parse_offer
    from anex_agent.providers.vastai.rentals import rent_body

    base = RentRequest(provision_id="pv-1", label="l", offer_id="1", image="i", env={})
    assert "price" not in rent_body(base)
    bid = dataclasses.replace(base, interruptible=True, bid_per_hour=0.21)
    assert rent_body(bid)["price"] == 0.21
    offer = parse_offer("NVIDIA GeForce RTX 4090@EU-RO-1/SECURE/x1")
    assert create_body(base, offer)["interruptible"] is False and create_body(bid, offer)["interruptible"] is True


async def test_bad_policy_annotation_is_400_before_anything_is_rented(tmp_path, shift):
    vast = FakeRentals()
    harness = await start(tmp_path, f"sqlite:///{tmp_path / 'c.db'}", shift, {"vastai": vast},
                          FakeSelector(offers("o1")))
    try:
        status, problem = await Api(harness).call("POST", "/v1/provisions", spec(**{"anex.sh/retry-for": "ever"}))
        assert status == 400 and problem["errors"][0]["field"] == "annotations.anex.sh/retry-for"
        assert "invalid annotations: anex.sh/retry-for" in problem["detail"]
        assert "duration" in problem["errors"][0]["message"]
        status, listed = await Api(harness).call("GET", "/v1/provisions")
        assert listed["provisions"] == [] and vast.rent_calls == []
    finally:
        await stop_harness(harness)


# ---------------------------------------------------------------------- retry policy


async def test_no_capacity_retried_for_the_window_exactly(tmp_path, database_url, shift):
    """Two candidates without capacity per round; retried 30-60 s apart while the 100 s window is open:
    three rounds, six attempts, then failed saying the window ended."""
    vast = FakeRentals()
    vast.faults["rent"] = ["no-capacity"] * 20
    harness = await start(tmp_path, database_url, shift, {"vastai": vast}, FakeSelector(offers("o1", "o2")), RETRY)
    api = Api(harness)
    try:
        pid = (await api.create(spec(**{"anex.sh/retry-on": "no-capacity", "anex.sh/retry-for": "100s"})))["id"]
        waiting = await api.until(pid, lambda v: v["retries"] == 1, "the first retry")
        assert waiting["state"] == "selecting" and waiting["next_retry_at"] and "no-capacity" in waiting["reason"]
        assert vast.rent_calls == ["o1", "o2"]
        loop = provisioner_of(harness.ctx)
        await loop._refresh_metrics(shift())  # what the scheduler does on every pass
        metrics = loop.render_metrics().decode()
        assert f'anex_provision_retries{{provision="{pid}",name="train-1"}} 1' in metrics
        shift.advance(60)
        await api.until(pid, lambda v: v["retries"] == 2, "the second retry")
        assert vast.rent_calls == ["o1", "o2"] * 2
        shift.advance(60)  # past the window: the third round is the last
        failed = await api.state(pid, "failed")
        assert vast.rent_calls == ["o1", "o2"] * 3 and len(failed["attempts"]) == 6
        assert "retry window" in failed["reason"]
        assert {a["event"] for a in failed["attempts"]} == {"no-capacity"}
        assert vast.rentals == {} and max(vast.alive_at_rent) == 0
    finally:
        await stop_harness(harness)


async def test_an_event_not_in_retry_on_ends_the_provision(tmp_path, database_url, shift):
    """retry-on: interruption; boot failures (event error) end the round: failed, no retry."""
    vast = FakeRentals(boot_status="loading")
    harness = await start(tmp_path, database_url, shift, {"vastai": vast}, FakeSelector(offers("o1")), RETRY)
    api = Api(harness)
    try:
        pid = (await api.create(spec(**{"anex.sh/retry-on": "interruption"})))["id"]
        await api.state(pid, "booting")
        shift.advance(151)
        failed = await api.state(pid, "failed")
        assert failed["retries"] == 0 and vast.rent_calls == ["o1"] and vast.rentals == {}
        assert [(a["outcome"], a["event"]) for a in failed["attempts"]] == [("deadline", "error")]
    finally:
        await stop_harness(harness)


# ---------------------------------------------------------------------- phase deadlines


async def test_machine_never_running_is_replaced_within_three_minutes(tmp_path, database_url, shift):
    vast = FakeRentals(boot_status="loading")
    harness = await start(tmp_path, database_url, shift, {"vastai": vast}, FakeSelector(offers("o1", "o2")), RETRY)
    api = Api(harness)
    try:
        pid = (await api.create())["id"]
        first = await api.state(pid, "booting")
        shift.advance(149)
        assert (await api.get(pid))["rental_id"] == "r1"
        shift.advance(2)  # the running phase's 150 s passed
        view = await api.until(pid, lambda v: v["rental_id"] == "r2", "the replacement rental")
        attempt = view["attempts"][0]
        assert attempt["outcome"] == "deadline" and attempt["reason"].startswith("phase running:")
        assert attempt["event"] == "error" and vast.destroyed == ["r1"] and max(vast.alive_at_rent) == 0
        assert "m-o1" in await BanStore(harness.ctx.db, clock=shift).banned_machines()
        took = _seconds(view["attempts"][1]["rented_at"]) - _seconds(first["attempts"][0]["rented_at"])
        assert took < 180, took
    finally:
        await stop_harness(harness)


async def test_join_and_heartbeat_deadlines_name_their_phase(tmp_path, database_url, shift):
    vast = FakeRentals()
    harness = await start(tmp_path, database_url, shift, {"vastai": vast}, FakeSelector(offers("o1", "o2", "o3")),
                          RETRY)
    api = Api(harness)
    try:
        pid = (await api.create(spec(**{"anex.sh/deadline-join": "30s"})))["id"]
        await api.until(pid, lambda v: v["state"] == "booting" and v["attempts"][0]["running_at"], "running")
        shift.advance(31)  # running, nobody joined within the annotation's 30 s
        view = await api.until(pid, lambda v: v["rental_id"] == "r2", "the second rental")
        assert view["attempts"][0]["reason"].startswith("phase join:")
        _client, joined = await boot_node(harness, vast.requests["r2"], heartbeat=False)
        await api.until(pid, lambda v: v["attempts"][1]["joined_at"], "joined")
        shift.advance(61)  # joined, no heartbeat within 60 s
        view = await api.until(pid, lambda v: v["rental_id"] == "r3", "the third rental")
        assert view["attempts"][1]["outcome"] == "deadline"
        assert view["attempts"][1]["reason"].startswith(f"phase heartbeat: node {joined.node_id}")
        assert vast.destroyed == ["r1", "r2"] and max(vast.alive_at_rent) == 0
    finally:
        await stop_harness(harness)


async def test_rent_call_past_its_deadline_is_a_failed_attempt(tmp_path, database_url, shift):
    vast = FakeRentals()
    real_rent = vast.rent
    hung: list[str] = []

    async def rent(request):
        if not hung:
            hung.append(request.offer_id)
            await real_rent(request)  # rented, but the answer never comes
            await asyncio_forever()
        return await real_rent(request)

    vast.rent = rent  # type: ignore[method-assign]
    harness = await start(tmp_path, database_url, shift, {"vastai": vast}, FakeSelector(offers("o1", "o2")), RETRY)
    api = Api(harness)
    try:
        pid = (await api.create(spec(**{"anex.sh/deadline-rent": "1s"})))["id"]
        view = await api.until(pid, lambda v: v["state"] == "booting", "the second rental", timeout=20)
        assert view["attempts"][0]["outcome"] == "deadline" and view["attempts"][0]["reason"].startswith("phase rent:")
        # what the unanswered call rented was destroyed before renting again
        assert vast.destroyed == ["r1"] and list(vast.rentals) == ["r2"] and vast.alive_at_rent == [0, 0]
    finally:
        await stop_harness(harness)


async def asyncio_forever() -> None:
    import asyncio

    await asyncio.Event().wait()


async def test_workload_not_started_within_its_deadline(tmp_path, database_url, shift):
    vast = FakeRentals()
    harness = await start(tmp_path, database_url, shift, {"vastai": vast}, FakeSelector(offers("o1", "o2")), RETRY)
    api = Api(harness)
    loop = provisioner_of(harness.ctx)
    try:
        pid = (await api.create(spec(**{"anex.sh/deadline-workload": "2m"})))["id"]
        await api.state(pid, "booting")
        client, joined = await boot_node(harness, vast.requests["r1"], heartbeat=False)
        waiting = Heartbeat(status=TransportStatus(workload=ContainerState(
            state="waiting", reason="ContainerCreating")))
        await client.heartbeat(joined.node_id, waiting)
        await api.state(pid, "ready")
        shift.advance(119)
        await loop.check_ready_nodes()
        assert (await api.get(pid))["state"] == "ready"
        shift.advance(2)
        await loop.check_ready_nodes()
        view = await api.until(pid, lambda v: v["rental_id"] == "r2", "the next candidate")
        attempt = view["attempts"][0]
        assert attempt["outcome"] == "deadline" and attempt["reason"].startswith("phase workload:")
        assert "ContainerCreating" in attempt["reason"]
        await wait_until(lambda: vast.destroyed == ["r1"], 10, "the rental destroyed")
    finally:
        await stop_harness(harness)


# ---------------------------------------------------------------------- interruptible


async def test_interruptible_outbid_is_replaced_by_policy(tmp_path, database_url, shift):
    vast = FakeRentals()
    vast.prices["o1"] = 0.25
    harness = await start(tmp_path, database_url, shift, {"vastai": vast},
                          FakeSelector(offers("o1", "o2", price=0.25)), RETRY)
    api = Api(harness)
    try:
        pid = (await api.create(spec(**{"anex.sh/interruptible": "true",
                                        "anex.sh/retry-on": "interruption"})))["id"]
        await api.state(pid, "booting")
        request = vast.requests["r1"]
        assert request.interruptible and request.bid_per_hour == 0.25
        await boot_node(harness, request)
        await api.state(pid, "ready")
        vast.interrupt("r1")  # outbid: stopped, still listed
        await provisioner_of(harness.ctx).reconcile()
        waiting = await api.until(pid, lambda v: v["retries"] == 1, "a retry")
        await wait_until(lambda: vast.destroyed == ["r1"], 10, "the rental destroyed")
        assert waiting["state"] == "selecting"
        assert (waiting["attempts"][0]["outcome"], waiting["attempts"][0]["event"]) == ("interrupted", "interruption")
        assert "outbid" in waiting["attempts"][0]["reason"]
        shift.advance(60)
        view = await api.until(pid, lambda v: v["state"] == "booting", "the replacement")
        assert view["rental_id"] == "r2" and vast.alive_at_rent == [0, 0]
    finally:
        await stop_harness(harness)


async def test_outbid_while_booting_tries_the_next_without_a_ban(tmp_path, database_url, shift):
    vast = FakeRentals(boot_status="loading")
    harness = await start(tmp_path, database_url, shift, {"vastai": vast}, FakeSelector(offers("o1", "o2")), RETRY)
    api = Api(harness)
    try:
        pid = (await api.create(spec(**{"anex.sh/interruptible": "true"})))["id"]
        await api.state(pid, "booting")
        vast.interrupt("r1")
        shift.advance(RETRY.status_interval + 1)  # the next look at the machine's status
        view = await api.until(pid, lambda v: v["rental_id"] == "r2", "the next candidate")
        assert (view["attempts"][0]["outcome"], view["attempts"][0]["event"]) == ("interrupted", "interruption")
        assert vast.destroyed == ["r1"] and max(vast.alive_at_rent) == 0
        assert "m-o1" not in await BanStore(harness.ctx.db, clock=shift).banned_machines()
    finally:
        await stop_harness(harness)


async def test_running_machine_stopped_before_its_node_joined_tries_the_next(tmp_path, database_url, shift):
    """Seen by the reconciler (the machine already runs, so booting no longer asks its status)."""
    vast = FakeRentals()
    harness = await start(tmp_path, database_url, shift, {"vastai": vast}, FakeSelector(offers("o1", "o2")), RETRY)
    api = Api(harness)
    try:
        pid = (await api.create())["id"]
        await api.until(pid, lambda v: v["state"] == "booting" and v["attempts"][0]["running_at"], "running")
        vast.interrupt("r1")
        await provisioner_of(harness.ctx).reconcile()
        view = await api.until(pid, lambda v: v["rental_id"] == "r2", "the next candidate")
        assert view["attempts"][0]["outcome"] == "interrupted" and view["retries"] == 0
        await wait_until(lambda: "r1" in vast.destroyed, 10, "the stopped rental destroyed")
        assert max(vast.alive_at_rent) == 0
    finally:
        await stop_harness(harness)


async def test_interruption_without_policy_is_lost(tmp_path, database_url, shift):
    vast = FakeRentals()
    harness = await start(tmp_path, database_url, shift, {"vastai": vast}, FakeSelector(offers("o1", "o2")), RETRY)
    api = Api(harness)
    try:
        pid = (await api.create())["id"]
        await api.state(pid, "booting")
        await boot_node(harness, vast.requests["r1"])
        await api.state(pid, "ready")
        vast.interrupt("r1")
        await provisioner_of(harness.ctx).reconcile()
        view = await api.state(pid, "lost")
        await wait_until(lambda: vast.rentals == {}, 10, "the rental destroyed")
        assert view["attempts"][0]["outcome"] == "interrupted" and vast.rent_calls == ["o1"]
    finally:
        await stop_harness(harness)


# ---------------------------------------------------------------------- GPU-aware lifecycle


def _telemetry(**gpu) -> Telemetry:
    return Telemetry.model_validate({"v": 1, "gpus": [{"index": 0, "uuid": "GPU-0", **gpu}]})


async def test_xid_79_bans_the_machine_and_reprovisions(tmp_path, database_url, shift):
    vast = FakeRentals()
    harness = await start(tmp_path, database_url, shift, {"vastai": vast}, FakeSelector(offers("o1", "o2")), RETRY)
    api = Api(harness)
    try:
        pid = (await api.create(spec(**{"anex.sh/retry-on": "error"})))["id"]
        await api.state(pid, "booting")
        client, joined = await boot_node(harness, vast.requests["r1"])
        await api.state(pid, "ready")
        await client.heartbeat(joined.node_id, Heartbeat(telemetry=_telemetry(
            last_xid=79, xid_counts={"79": 1}, gpu_util_pct=90)))
        shift.advance(2)  # the ready nodes' look (every 2 s) is due at the scheduler's next pass
        waiting = await api.until(pid, lambda v: v["retries"] == 1, "a retry after the GPU fault")
        attempt = waiting["attempts"][0]
        assert attempt["outcome"] == "unhealthy" and attempt["event"] == "error" and "XID 79" in attempt["reason"]
        await wait_until(lambda: vast.destroyed == ["r1"], 10, "the rental destroyed")  # right after the state
        assert "m-o1" in await BanStore(harness.ctx.db, clock=shift).banned_machines()
        assert joined.node_id not in [n.id for n in (await harness.admin.list_nodes()).nodes]
        shift.advance(60)
        view = await api.until(pid, lambda v: v["state"] == "booting", "re-provisioned")
        assert view["rental_id"] == "r2" and vast.alive_at_rent == [0, 0]
    finally:
        await stop_harness(harness)


async def test_idle_gpus_release_the_machine_after_the_window(tmp_path, database_url, shift):
    vast = FakeRentals()
    harness = await start(tmp_path, database_url, shift, {"vastai": vast}, FakeSelector(offers("o1")), RETRY)
    api = Api(harness)
    loop = provisioner_of(harness.ctx)
    try:
        pid = (await api.create(spec(**{"anex.sh/idle-release": "30m"})))["id"]
        await api.state(pid, "booting")
        client, joined = await boot_node(harness, vast.requests["r1"])
        await api.state(pid, "ready")
        await client.heartbeat(joined.node_id, Heartbeat(telemetry=_telemetry(gpu_util_pct=2)))
        shift.advance(2)  # the ready nodes' look (every 2 s) is due at the scheduler's next pass
        idle = await api.until(pid, lambda v: v["idle_since"], "the GPUs seen idle")
        assert idle["state"] == "ready"
        shift.advance(1799)
        await loop.check_ready_nodes()
        assert (await api.get(pid))["state"] == "ready"
        shift.advance(2)
        await loop.check_ready_nodes()
        view = await api.state(pid, "released")
        assert view["attempts"][0]["outcome"] == "idle" and view["attempts"][0]["event"] is None
        assert "below 5% utilization for 1800s" in view["reason"]
        await wait_until(lambda: vast.rentals == {}, 10, "the rental destroyed")
    finally:
        await stop_harness(harness)


# ---------------------------------------------------------------------- resumed by another coordinator


async def test_stopped_mid_retry_resumed_by_another_without_a_second_rental(tmp_path, database_url, shift):
    vast = FakeRentals()
    first = await start(tmp_path, database_url, shift, {"vastai": vast}, FakeSelector(offers("o1", "o2")), RETRY)
    api = Api(first)
    pid = (await api.create(spec(**{"anex.sh/retry-on": "interruption"})))["id"]
    await api.state(pid, "booting")
    await boot_node(first, vast.requests["r1"])
    await api.state(pid, "ready")
    vast.interrupt("r1")
    await provisioner_of(first.ctx).reconcile()
    await api.until(pid, lambda v: v["retries"] == 1, "a retry")
    await stop_harness(first)  # stopped while waiting for the retry
    assert vast.rent_calls == ["o1"]
    second = await start(tmp_path, database_url, shift, {"vastai": vast}, FakeSelector(offers("o1", "o2")), RETRY)
    api = Api(second)
    try:
        shift.advance(60)
        view = await api.until(pid, lambda v: v["state"] == "booting", "the retry, resumed", timeout=15)
        assert view["retries"] == 1 and vast.rent_calls == ["o1", "o1"] and list(vast.rentals) == ["r2"]
        assert vast.alive_at_rent == [0, 0]
        await boot_node(second, vast.requests["r2"])
        ready = await api.state(pid, "ready")
        assert ready["retries"] == 0  # ready again: the next interruption opens a new window
    finally:
        await stop_harness(second)


def _seconds(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
