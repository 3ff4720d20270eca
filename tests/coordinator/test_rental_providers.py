"""The Vast.AI and RunPod rental clients against the fake providers (anex_agent.testing.fake_providers):
rent, idempotent destroy, list by label, every error mapping, and no API key in any log line."""

from __future__ import annotations

import asyncio
import logging

import pytest

from anex_agent.providers.rentals import (
    KeyRefused, NoCapacity, ProviderUnavailable, RegistryLogin, RentRefused, RentRequest, cluster_label_prefix,
    rental_label,
)
from anex_agent.providers.runpod.rentals import RunPodRentalConfig, RunPodRentals, parse_offer
from anex_agent.providers.vastai.rentals import VastAIRentals, rent_body
from anex_agent.testing.fake_providers import FakeRunPod, FakeVastAI
from anex_agent.providers.offers_http import HttpPolicy
from anex_agent.providers.vastai.offers import VastAIConfig

KEY = "secret-provider-key-7f3a9c"
CLUSTER = "c1"
FAST = HttpPolicy(timeout=2.0, attempts=3, backoff=0.01, max_backoff=0.02, max_retry_after=0.05)
RUNPOD_OFFER = "NVIDIA GeForce RTX 4090@EU-RO-1/SECURE/x1"


def request(offer_id: str, provision: str = "p1", **overrides) -> RentRequest:
    values = dict(provision_id=provision, label=rental_label(CLUSTER, provision), offer_id=offer_id,
                  image="ghcr.io/example/agent:1", env={"ANEX_JOIN_TOKEN": "jt_boot", "A": "x y"},
                  command=("python", "train.py"), ports=(8080,), disk_gb=20.5)
    values.update(overrides)
    return RentRequest(**values)


class Side:
    """One provider under test: its fake, its client, how an offer id is spelled."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.fake = FakeVastAI(api_key=KEY) if kind == "vastai" else FakeRunPod(api_key=KEY)

    def offer(self, n: int = 1) -> str:
        return str(4000 + n) if self.kind == "vastai" else RUNPOD_OFFER.replace("x1", f"x{n}")

    def client(self, key: str = KEY, policy: HttpPolicy = FAST):
        if self.kind == "vastai":
            return VastAIRentals(VastAIConfig(api_key=key, base_url=self.fake.url, policy=policy))
        return RunPodRentals(RunPodRentalConfig(api_key=key, rest_url=self.fake.url, policy=policy))


@pytest.fixture(params=["vastai", "runpod"])
async def side(request):
    s = Side(request.param)
    await s.fake.start()
    s.rentals = s.client()
    yield s
    await s.rentals.aclose()
    await s.fake.close()


async def test_rent_creates_one_labelled_rental_with_its_price(side):
    side.fake.prices[side.offer()] = 0.42
    rental = await side.rentals.rent(request(side.offer()))
    assert rental.provider == side.kind and rental.label == rental_label(CLUSTER, "p1")
    assert rental.price_per_hour == pytest.approx(0.42)
    made = side.fake.rentals[rental.rental_id]
    assert made.label == rental.label and made.image == "ghcr.io/example/agent:1"
    assert made.env["ANEX_JOIN_TOKEN"] == "jt_boot" and made.env["A"] == "x y"
    assert made.command == ["python", "train.py"]
    assert len(side.fake.rentals) == 1


async def test_rent_with_a_start_script(side):
    rental = await side.rentals.rent(request(side.offer(), onstart="#!/bin/sh\nexec true\n"))
    assert side.fake.rentals[rental.rental_id].onstart == "#!/bin/sh\nexec true\n"


def test_vast_rent_body_has_the_api_shape():
    body = rent_body(request("4001"))
    assert body["client_id"] == "me" and body["runtype"] == "args" and body["args"] == ["python", "train.py"]
    assert body["env"] == {"ANEX_JOIN_TOKEN": "jt_boot", "A": "x y", "-p 8080:8080": "1"}
    assert body["disk"] == 21 and body["label"] == "anex:c1:p1"
    script = rent_body(request("4001", onstart="echo hi"))
    assert script["runtype"] == "ssh" and script["onstart"] == "echo hi" and "args" not in script


def test_runpod_offer_ids_are_the_selections():
    offer = parse_offer("NVIDIA GeForce RTX 4090@EU-RO-1/COMMUNITY/x2")
    assert offer and offer.gpu_type_id == "NVIDIA GeForce RTX 4090" and offer.datacenter_id == "EU-RO-1"
    assert offer.cloud_type == "COMMUNITY" and offer.gpu_count == 2
    assert parse_offer("RTX 4090") is None and parse_offer("x@EU-RO-1/CHEAP/x1") is None


async def test_destroy_is_idempotent(side):
    rental = await side.rentals.rent(request(side.offer()))
    await side.rentals.destroy(rental.rental_id)
    assert rental.rental_id not in side.fake.rentals and side.fake.destroyed == [rental.rental_id]
    await side.rentals.destroy(rental.rental_id)  # already gone: success
    await side.rentals.destroy("999999")  # never existed: success


async def test_list_keeps_only_this_clusters_labels(side):
    mine = await side.rentals.rent(request(side.offer(1), "p1"))
    other = await side.rentals.rent(request(side.offer(2), "p2", label=rental_label("other", "p2")))
    listed = await side.rentals.list_rentals(cluster_label_prefix(CLUSTER))
    assert [r.rental_id for r in listed] == [mine.rental_id]
    assert listed[0].label == "anex:c1:p1" and listed[0].price_per_hour == pytest.approx(0.5)
    assert {r.rental_id for r in await side.rentals.list_rentals("anex:")} == {mine.rental_id, other.rental_id}


async def test_a_refused_offer_is_rent_refused_with_the_providers_reason(side):
    side.fake.refuse(side.offer())
    with pytest.raises(RentRefused) as info:
        await side.rentals.rent(request(side.offer()))
    assert info.value.offer_id == side.offer() and "400" in info.value.reason
    assert ("no_such_ask" if side.kind == "vastai" else "no longer any instances") in info.value.reason
    assert not side.fake.rentals


async def test_vast_offer_already_rented_is_refused():
    async with FakeVastAI(offers={"4001"}) as fake:
        rentals = VastAIRentals(VastAIConfig(base_url=fake.url, policy=FAST))
        await rentals.rent(request("4001"))
        with pytest.raises(RentRefused):
            await rentals.rent(request("4001", "p2"))
        with pytest.raises(RentRefused):  # not an offer the provider knows
            await rentals.rent(request("4002", "p3"))
        with pytest.raises(RentRefused):  # not even an offer id
            await rentals.rent(request("../instances", "p4"))
        assert len(fake.rentals) == 1


@pytest.mark.parametrize("status", [429, 500, 503])
async def test_rent_failures_are_unavailable_and_never_retried_blindly(side, status):
    side.fake.fail("rent", status, retry_after=7 if status == 429 else None)
    with pytest.raises(ProviderUnavailable) as info:
        await side.rentals.rent(request(side.offer()))
    assert info.value.retry_after == (7.0 if status == 429 else None)
    assert [c for c in side.fake.calls if c[0] in ("PUT", "POST")] == [c for c in side.fake.calls[:1]]  # one attempt
    assert not side.fake.rentals
    assert (await side.rentals.rent(request(side.offer()))).rental_id  # the provider is back


async def test_a_lost_rent_answer_leaves_the_rental_findable_by_label(side):
    side.fake.lose_answer()
    with pytest.raises(ProviderUnavailable):
        await side.rentals.rent(request(side.offer()))
    assert len(side.fake.rentals) == 1  # made, though the answer said 500
    listed = await side.rentals.list_rentals(cluster_label_prefix(CLUSTER))
    assert [r.label for r in listed] == ["anex:c1:p1"]


async def test_rent_timeout_is_unavailable(side):
    async def slow(_rental):
        await asyncio.sleep(1.0)

    side.fake.on_rent = slow
    rentals = side.client(policy=HttpPolicy(timeout=0.2, attempts=3, backoff=0.01))
    try:
        with pytest.raises(ProviderUnavailable) as info:
            await rentals.rent(request(side.offer()))
        assert "timed out" in info.value.reason
    finally:
        await rentals.aclose()


async def test_destroy_and_list_retry_429_and_5xx_then_succeed(side):
    rental = await side.rentals.rent(request(side.offer()))
    side.fake.fail("destroy", 429, retry_after=0)
    side.fake.fail("destroy", 503)
    await side.rentals.destroy(rental.rental_id)
    assert not side.fake.rentals
    side.fake.fail("list", 500, times=2)
    assert await side.rentals.list_rentals("anex:") == []


async def test_destroy_and_list_that_keep_failing_are_unavailable(side):
    rental = await side.rentals.rent(request(side.offer()))
    side.fake.fail("destroy", 503, times=10, retry_after=3)
    with pytest.raises(ProviderUnavailable) as info:
        await side.rentals.destroy(rental.rental_id)
    assert info.value.retry_after == 3.0
    assert rental.rental_id in side.fake.rentals
    side.fake.fail("list", 500, times=10)
    with pytest.raises(ProviderUnavailable):
        await side.rentals.list_rentals("anex:")


async def test_a_vanished_rental_is_no_longer_listed_and_destroying_it_succeeds(side):
    rental = await side.rentals.rent(request(side.offer()))
    side.fake.vanish(rental.rental_id)
    assert await side.rentals.list_rentals(cluster_label_prefix(CLUSTER)) == []
    await side.rentals.destroy(rental.rental_id)


async def test_a_refused_key_is_unavailable_and_never_logged(side, caplog):
    caplog.set_level(logging.DEBUG)
    wrong = "wrong-key-0a1b2c3d"
    rentals = side.client(key=wrong)
    try:
        for call in (rentals.rent(request(side.offer())), rentals.destroy("1001"), rentals.list_rentals("anex:")):
            with pytest.raises(KeyRefused) as info:  # its own kind: the loop fails the provision
                await call
            assert "API key was refused" in info.value.reason and wrong not in str(info.value)
    finally:
        await rentals.aclose()
    # and the right key, through a whole rent/list/destroy, is not logged either
    rental = await side.rentals.rent(request(side.offer()))
    await side.rentals.list_rentals("anex:")
    await side.rentals.destroy(rental.rental_id)
    assert caplog.records and wrong not in caplog.text and KEY not in caplog.text
    assert KEY not in repr(side.rentals.config)


async def test_hooks_run_on_rent_and_destroy(side):
    seen: list[tuple[str, str]] = []

    async def on_rent(rental):
        seen.append(("rent", rental.label))
        rental.handle = "started"

    side.fake.on_rent = on_rent
    side.fake.on_destroy = lambda rental: seen.append(("destroy", rental.handle))
    rental = await side.rentals.rent(request(side.offer()))
    await side.rentals.destroy(rental.rental_id)
    assert seen == [("rent", "anex:c1:p1"), ("destroy", "started")]


def test_runpod_rental_config_follows_the_selections():
    from anex_agent.providers.runpod.offers import RunPodConfig

    config = RunPodRentalConfig.from_source(RunPodConfig(api_key=KEY, policy=FAST), rest_url="http://x/v1")
    assert config.api_key == KEY and config.policy == FAST and config.rest_url == "http://x/v1"
    assert KEY not in repr(config)


async def test_no_capacity_is_its_own_error_and_rents_nothing(side):
    side.fake.no_capacity()
    with pytest.raises(NoCapacity) as info:
        await side.rentals.rent(request(side.offer()))
    assert "no longer any instances available" in info.value.reason and side.fake.rentals == {}
    side.fake.fail("rent", 500)  # a plain 500 says nothing about capacity: the outcome stays unknown
    with pytest.raises(ProviderUnavailable) as info:
        await side.rentals.rent(request(side.offer()))
    assert not isinstance(info.value, NoCapacity)
    assert (await side.rentals.rent(request(side.offer()))).rental_id in side.fake.rentals


LOGIN = RegistryLogin("registry.example.com", "puller", "pull-pa55-word", fingerprint="f" * 64)


async def test_a_private_images_registry_login_reaches_the_provider_as_its_api_takes_it(side, caplog):
    caplog.set_level(logging.DEBUG)
    first = await side.rentals.rent(request(side.offer(), registry_login=LOGIN))
    second = await side.rentals.rent(request(side.offer(2), provision="p2", registry_login=LOGIN))
    if side.kind == "vastai":
        for rental in (first, second):
            assert side.fake.rentals[rental.rental_id].body["image_login"] == \
                "-u puller -p pull-pa55-word registry.example.com"
    else:  # saved once at RunPod under a name that says nothing of it, then named by each pod
        [saved] = side.fake.registry_auths.values()
        assert (saved["username"], saved["password"]) == ("puller", "pull-pa55-word")
        assert saved["name"] == "anex-" + "f" * 32
        assert {side.fake.rentals[r.rental_id].body["containerRegistryAuthId"] for r in (first, second)} == \
            {saved["id"]}
    assert "pull-pa55-word" not in caplog.text and "pull-pa55-word" not in repr(LOGIN)
    plain = await side.rentals.rent(request(side.offer(3), provision="p3"))
    assert not {"image_login", "containerRegistryAuthId"} & set(side.fake.rentals[plain.rental_id].body)


async def test_the_fakes_refuse_a_login_their_api_would_refuse(side):
    import aiohttp

    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {KEY}"}) as http:
        if side.kind == "vastai":
            answer = await http.put(f"{side.fake.url}/asks/{side.offer()}/", json={
                "client_id": "me", "image": "x", "image_login": "puller:pw@registry"})
        else:
            answer = await http.post(f"{side.fake.url}/pods", json={
                "name": "n", "imageName": "x", "containerRegistryAuthId": "cra-unknown"})
        assert answer.status == 400
