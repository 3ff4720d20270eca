"""The coordinator client's provisioning calls (what the virtual node uses) against a real
coordinator app: POST idempotent by name (409 on another body, 400 naming a bad annotation),
GET one and all, DELETE, and the provisions watch stream (a snapshot, then changes)."""

from __future__ import annotations

import asyncio

import pytest

from anex_agent.errors import CoordinatorError
from anex_agent.wire.provisioning import ProvisionCreate, ProvisionState
from tests.coordinator.conftest import stop_harness
from tests.coordinator.provisioning_fakes import FakeRentals, FakeSelector, ShiftClock, offers, start

SPEC = ProvisionCreate(name="vk-1234", image="busybox", command=["sh", "-c", "exit 0"],
                       annotations={"anex.sh/gpu-count": "1"}, agent="entrypoint")


async def test_client_creates_lists_deletes_and_watches_provisions(tmp_path, database_url):
    harness = await start(tmp_path, database_url, ShiftClock(), {"vastai": FakeRentals()},
                          FakeSelector(offers("o1")))
    client = harness.admin
    try:
        stream = client.watch_provisions()
        first = await asyncio.wait_for(anext(stream), 10)
        assert first.type == "snapshot" and first.provisions == []

        created = await client.create_provision(SPEC)
        assert created.name == "vk-1234" and created.state == ProvisionState.selecting
        again = await client.create_provision(SPEC)
        assert again.id == created.id  # idempotent: the same name and body answer the same provision
        with pytest.raises(CoordinatorError) as conflict:
            await client.create_provision(SPEC.model_copy(update={"image": "alpine"}))
        assert conflict.value.status == 409 and not conflict.value.retryable

        changed = await asyncio.wait_for(anext(stream), 10)
        assert changed.type == "changed" and changed.provision.id == created.id

        assert [p.id for p in (await client.list_provisions()).provisions] == [created.id]
        assert (await client.get_provision(created.id)).name == "vk-1234"
        deleted = await client.delete_provision(created.id)
        assert deleted.state in (ProvisionState.deleting, ProvisionState.deleted)
        await stream.aclose()
    finally:
        await stop_harness(harness)


async def test_a_bad_annotation_is_a_400_naming_it(tmp_path, database_url):
    harness = await start(tmp_path, database_url, ShiftClock(), {"vastai": FakeRentals()}, FakeSelector([]))
    try:
        with pytest.raises(CoordinatorError) as bad:
            await harness.admin.create_provision(SPEC.model_copy(update={"annotations": {"anex.sh/gpu-cont": "1"}}))
        assert bad.value.status == 400
        assert [e["field"] for e in bad.value.problem["errors"]] == ["annotations.anex.sh/gpu-cont"]
        assert (await harness.admin.list_provisions()).provisions == []
    finally:
        await stop_harness(harness)
