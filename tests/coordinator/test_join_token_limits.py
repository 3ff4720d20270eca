"""Join token limits: uses (default single-use), expiry, providers; counted atomically."""

from __future__ import annotations

import asyncio
import shutil

import aiohttp

import pytest

from anex_agent.wire import keys
from anex_agent.wire.base import Provider
from anex_agent.wire.join import JoinTokenView
from anex_agent.coordinator import db as dbmod, tokens
from anex_agent.coordinator.migrations import CORE, apply
from anex_agent.errors import CoordinatorError

from .conftest import start_harness, stop_harness
from .lock_waits import another_waits
from tests.polling import wait_until


def new_key() -> keys.KeyPair:
    return keys.KeyPair(keys.generate_private_key())


async def create_raw(coord, body: dict) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {coord.ctx.admin_token}"}
    async with aiohttp.ClientSession() as session:
        async with session.post(coord.url + "/v1/join-tokens", headers=headers, json=body) as resp:
            return resp.status, await resp.json(content_type=None)


async def listed(coord, token_id: str) -> JoinTokenView:
    return {t.id: t for t in (await coord.admin.list_join_tokens()).tokens}[token_id]


async def test_default_token_is_single_use_and_its_node_may_rejoin(coord):
    token = await coord.admin.create_join_token()
    assert token.max_uses == 1 and not token.reusable
    key = new_key()
    first = await coord.client().join(token.token, key, "n", "vastai")
    again = await coord.client().join(token.token, key, "n", "vastai")
    assert again.node_id == first.node_id
    with pytest.raises(CoordinatorError) as err:
        await coord.client().join(token.token, new_key(), "other", "vastai")
    assert err.value.status == 401
    view = await listed(coord, token.id)
    assert (view.uses, view.max_uses, view.use_count, view.used_by) == (1, 1, 2, first.node_id)
    assert len((await coord.admin.list_nodes()).nodes) == 1


async def test_max_uses_admits_that_many_nodes_and_rejoins_are_free(coord):
    token = await coord.admin.create_join_token(max_uses=3)
    assert token.max_uses == 3 and token.reusable
    keys_ = [new_key() for _ in range(3)]
    joined = [await coord.client().join(token.token, k, f"n{i}", "other") for i, k in enumerate(keys_)]
    with pytest.raises(CoordinatorError) as err:
        await coord.client().join(token.token, new_key(), "fourth", "other")
    assert err.value.status == 401
    again = await coord.client().join(token.token, keys_[0], "n0", "other")  # a restarted agent
    assert again.node_id == joined[0].node_id
    view = await listed(coord, token.id)
    assert (view.uses, view.max_uses, view.use_count) == (3, 3, 4)
    assert len((await coord.admin.list_nodes()).nodes) == 3


async def test_a_node_admitted_by_another_token_needs_a_free_use(coord):
    spent = await coord.admin.create_join_token()
    await coord.client().join(spent.token, new_key(), "x", "other")
    key = new_key()
    await coord.client().join((await coord.admin.create_join_token()).token, key, "n", "other")
    with pytest.raises(CoordinatorError) as err:  # its key is known, but not to this token
        await coord.client().join(spent.token, key, "n", "other")
    assert err.value.status == 401


async def test_reusable_means_no_limit_and_contradictions_are_422(coord):
    token = await coord.admin.create_join_token(reusable=True)
    assert token.max_uses is None and token.reusable
    for i in range(4):
        await coord.client().join(token.token, new_key(), f"n{i}", "other")
    view = await listed(coord, token.id)
    assert (view.uses, view.max_uses) == (4, None)
    with pytest.raises(CoordinatorError) as err:
        await coord.admin.create_join_token(reusable=True, max_uses=1)
    assert err.value.status == 422 and err.value.problem["errors"][0]["field"] == "max_uses"
    status, problem = await create_raw(coord, {"max_uses": 0})
    assert status == 422 and problem["errors"][0]["field"] == "max_uses"


async def test_expired_token_is_refused_even_with_uses_left(coord):
    token = await coord.admin.create_join_token(reusable=True, expires_in=10)
    await coord.client().join(token.token, new_key(), "before", "other")
    coord.clock.advance(11)
    with pytest.raises(CoordinatorError) as err:
        await coord.client().join(token.token, new_key(), "after", "other")
    assert err.value.status == 401


async def test_providers_limit_refuses_another_provider_with_403_naming_it(coord):
    token = await coord.admin.create_join_token(max_uses=5, providers=["runpod", "vastai"])
    assert token.providers == [Provider.runpod, Provider.vastai]
    with pytest.raises(CoordinatorError) as err:
        await coord.client().join(token.token, new_key(), "n", "onprem")
    assert err.value.status == 403
    assert err.value.problem["errors"] == [{"field": "provider", "message": "the join token allows only runpod, vastai"}]
    assert "onprem" in err.value.problem["detail"]
    assert (await coord.admin.list_nodes()).nodes == []  # nothing half-written
    key = new_key()
    ok = await coord.client().join(token.token, key, "n", "runpod")
    with pytest.raises(CoordinatorError) as err:  # a re-join may not switch to another provider either
        await coord.client().join(token.token, key, "n", "other")
    assert err.value.status == 403
    assert (await coord.admin.get_node(ok.node_id)).provider == Provider.runpod
    view = await listed(coord, token.id)
    assert view.uses == 1 and view.providers == [Provider.runpod, Provider.vastai]


async def test_providers_only_for_node_tokens_and_never_empty(coord):
    with pytest.raises(CoordinatorError) as err:
        await coord.admin.create_join_token("gateway", providers=["vastai"])
    assert err.value.status == 422 and err.value.problem["errors"][0]["field"] == "providers"
    status, problem = await create_raw(coord, {"providers": []})
    assert status == 422 and problem["errors"][0]["field"] == "providers"


async def test_gateway_tokens_count_uses_too(coord):
    token = await coord.admin.create_join_token("gateway")
    key = new_key()
    await coord.client().register_gateway(token.token, key, "gw")
    await coord.client().register_gateway(token.token, key, "gw")
    with pytest.raises(CoordinatorError) as err:
        await coord.client().register_gateway(token.token, new_key(), "gw2")
    assert err.value.status == 401


async def test_concurrent_joins_on_several_coordinators_never_exceed_max_uses(tmp_path, database_url, clock):
    """Each coordinator serialises its own joins; the database alone keeps coordinators apart."""
    coords = [await start_harness(tmp_path / "0", database_url, clock)]
    try:
        for i in (1, 2):  # coordinators sharing a database share the signing key and the coordinator key
            (tmp_path / str(i)).mkdir()
            for name in ("access-token-signing-key", "coordinator-key", "ssh-ca-key"):
                shutil.copy(tmp_path / "0" / name, tmp_path / str(i))
            coords.append(await start_harness(tmp_path / str(i), database_url, clock))
        token = await coords[0].admin.create_join_token(max_uses=3)

        async def attempt(i: int):
            try:
                return await coords[i % 3].client().join(token.token, new_key(), f"n{i}", "other")
            except CoordinatorError as err:
                return err.status

        results = await asyncio.gather(*(attempt(i) for i in range(12)))
        admitted = [r for r in results if not isinstance(r, int)]
        assert len(admitted) == 3
        assert sorted(r for r in results if isinstance(r, int)) == [401] * 9
        view = await listed(coords[0], token.id)
        assert (view.uses, view.max_uses) == (3, 3)
        assert {n.id for n in (await coords[0].admin.list_nodes()).nodes} == {r.node_id for r in admitted}
    finally:
        for c in coords:
            await stop_harness(c)


async def test_a_join_that_read_a_single_use_token_unused_is_refused_when_another_used_it_meanwhile(coord):
    """Two joins with one single-use token, both past the check that it is unused: the one whose
    use commits second is refused (401 used_up) and writes nothing. The use is counted by one
    conditional update (``uses < max_uses``), which PostgreSQL re-checks after waiting for the
    first join's row lock; a read of ``uses`` followed by a write would admit both."""
    token = await coord.admin.create_join_token()
    db = coord.ctx.db
    row = await db.fetchrow("SELECT * FROM join_tokens WHERE id = $1", token.id)
    async with db.transaction() as first:  # the first join (another coordinator), not yet committed
        await tokens.redeem(first, row, "n-first", now=coord.clock())
        second = asyncio.create_task(coord.client().join(token.token, new_key(), "second", "other"))
        await wait_until(lambda: another_waits(db), what="the second join to wait for the first")
    with pytest.raises(CoordinatorError) as err:
        await second
    assert err.value.status == 401 and err.value.problem["errors"][0]["message"].startswith("it is used up")
    view = await listed(coord, token.id)
    assert (view.uses, view.used_by) == (1, "n-first")
    assert (await coord.admin.list_nodes()).nodes == []


async def test_migration_keeps_old_tokens_meaning(database_url):
    db = await dbmod.open_database(database_url)
    try:
        await apply(db, CORE[:1])
        async with db.transaction() as tx:
            for tid, reusable, used_by, uses in (("jt_s", 0, "n_a", 1), ("jt_f", 0, None, 0), ("jt_r", 1, None, 2)):
                await tx.execute(
                    "INSERT INTO join_tokens (id, token_hash, kind, reusable, labels, created_at, expires_at,"
                    " used_at, used_by, use_count) VALUES ($1, $2, 'node', $3, '{}', 1, 2, $4, $5, $6)",
                    tid, "h" + tid, reusable, 1.5 if used_by else None, used_by, uses,
                )
        await apply(db, CORE)
        rows = {r["id"]: r for r in await db.fetch("SELECT id, max_uses, uses FROM join_tokens")}
        assert {k: (r["max_uses"], r["uses"]) for k, r in rows.items()} == {
            "jt_s": (1, 1), "jt_f": (1, 0), "jt_r": (None, 2)
        }
        owners = await db.fetch("SELECT token_id, owner_id FROM join_token_uses")
        assert [(r["token_id"], r["owner_id"]) for r in owners] == [("jt_s", "n_a")]
    finally:
        await db.close()
