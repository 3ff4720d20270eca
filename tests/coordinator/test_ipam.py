"""IPAM: sequential, shared pool with gateways, quarantine, exhaustion, rollback, DB uniqueness."""

from __future__ import annotations

import asyncio

import pytest

from anex_agent.coordinator import ipam
from anex_agent.coordinator.db import open_database
from anex_agent.coordinator.migrations import CORE, apply
from anex_agent.errors import ConfigError
from tests.coordinator.lock_waits import another_waits
from tests.polling import wait_until


@pytest.fixture
async def db(database_url):
    database = await open_database(database_url)
    await apply(database, CORE)
    try:
        yield database
    finally:
        await database.close()


async def alloc(db, pool, owner, now=1000.0):
    async with db.transaction() as tx:
        return await ipam.allocate(tx, pool, owner, now=now)


async def release(db, pool, address, now, quarantine):
    async with db.transaction() as tx:
        await ipam.release(tx, pool, address, now=now, quarantine=quarantine)


def test_pool_parse_and_bounds():
    pool = ipam.Pool.parse("10.254.0.0/16")
    assert pool.to_str(pool.first) == "10.254.0.1"
    assert pool.to_str(pool.last) == "10.254.255.254"
    assert pool.size == 65534
    assert ipam.Pool.parse("10.254.3.7/24").cidr == "10.254.3.0/24"
    with pytest.raises(ValueError):
        pool.to_int("10.255.0.1")
    for bad, words in [("nonsense", "CIDR"), ("fd00::/64", "IPv4"), ("10.0.0.0/31", "/30")]:
        with pytest.raises(ConfigError) as err:
            ipam.Pool.parse(bad)
        assert err.value.source == "--network" and words in str(err.value)


async def test_sequential_after_the_highest_address(db):
    pool = ipam.Pool.parse("10.1.0.0/24")
    got = [await alloc(db, pool, f"o{i}") for i in range(4)]
    assert got == ["10.1.0.1", "10.1.0.2", "10.1.0.3", "10.1.0.4"]
    await release(db, pool, "10.1.0.2", now=1000, quarantine=0)
    # a released address is a quarantined row, not a gap: the sequence continues past it
    assert await alloc(db, pool, "next", now=1001) == "10.1.0.5"


async def test_gaps_are_filled_when_the_top_is_reached(db):
    pool = ipam.Pool.parse("10.6.0.0/29")  # 6 usable addresses
    for i in range(4):
        await alloc(db, pool, f"o{i}")
    await db.execute("DELETE FROM addresses WHERE n = $1", pool.to_int("10.6.0.2"))  # a hole, made by hand
    got = [await alloc(db, pool, f"n{i}") for i in range(3)]
    assert got == ["10.6.0.5", "10.6.0.6", "10.6.0.2"]
    with pytest.raises(ipam.NetworkExhausted):
        await alloc(db, pool, "more")


async def test_quarantine_then_reuse_when_full(db):
    pool = ipam.Pool.parse("10.2.0.0/30")  # two usable addresses
    a = await alloc(db, pool, "a")
    b = await alloc(db, pool, "b")
    with pytest.raises(ipam.NetworkExhausted) as err:
        await alloc(db, pool, "c")
    assert "10.2.0.0/30" in str(err.value)
    await release(db, pool, a, now=1000, quarantine=60)
    with pytest.raises(ipam.NetworkExhausted):
        await alloc(db, pool, "c", now=1059)  # still quarantined
    assert await alloc(db, pool, "c", now=1060) == a
    with pytest.raises(ipam.NetworkExhausted):
        await alloc(db, pool, "d", now=5000)
    assert b != a


async def test_failed_transaction_leaves_no_address(db):
    pool = ipam.Pool.parse("10.3.0.0/24")
    with pytest.raises(RuntimeError):
        async with db.transaction() as tx:
            await ipam.allocate(tx, pool, "doomed", now=1.0)
            raise RuntimeError("join failed after allocation")
    assert await alloc(db, pool, "next") == "10.3.0.1"


async def test_the_database_refuses_a_duplicate_address(db):
    pool = ipam.Pool.parse("10.4.0.0/24")
    address = await alloc(db, pool, "a")
    with pytest.raises(Exception):
        async with db.transaction() as tx:
            await tx.execute("INSERT INTO addresses (n, owner) VALUES ($1, 'b')", pool.to_int(address))


async def test_concurrent_allocations_are_unique(db):
    pool = ipam.Pool.parse("10.5.0.0/24")
    got = await asyncio.gather(*(alloc(db, pool, f"o{i}") for i in range(40)))
    assert len(set(got)) == 40
    assert sorted(got, key=pool.to_int) == [pool.to_str(pool.first + i) for i in range(40)]


from hypothesis import given, settings as hsettings, strategies as st

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(0, 0)),
        st.tuples(st.just("free"), st.integers(0, 50)),  # index into the currently held addresses
        st.tuples(st.just("wait"), st.integers(1, 40)),  # seconds
    ),
    max_size=60,
)


@given(OPS)
@hsettings(max_examples=60, deadline=None)
def test_model_never_two_owners_never_early_reuse(ops):
    """Against a simple model: held addresses are unique, in the pool, and a freed address
    comes back only after its quarantine and only when no never-used address is left."""
    quarantine = 30.0

    async def run() -> None:
        db = await open_database(":memory:")
        await apply(db, CORE)
        pool = ipam.Pool.parse("10.7.0.0/29")  # 6 usable addresses: exhaustion happens
        held: list[str] = []
        freed_at: dict[str, float] = {}
        ever_used: set[str] = set()
        now = 1000.0
        try:
            for op, arg in ops:
                if op == "wait":
                    now += arg
                elif op == "free" and held:
                    address = held.pop(arg % len(held))
                    await release(db, pool, address, now, quarantine)
                    freed_at[address] = now
                elif op == "alloc":
                    fresh_left = pool.size - len(ever_used)
                    reusable = sorted((a for a, t in freed_at.items() if t + quarantine <= now), key=pool.to_int)
                    try:
                        address = await alloc(db, pool, f"o{len(ever_used)}", now=now)
                    except ipam.NetworkExhausted:
                        assert fresh_left == 0 and not reusable
                        continue
                    assert address not in held
                    if fresh_left:
                        assert address not in ever_used
                    else:
                        assert address == reusable[0]
                        del freed_at[address]
                    held.append(address)
                    ever_used.add(address)
                    assert pool.first <= pool.to_int(address) <= pool.last
        finally:
            await db.close()

    asyncio.run(run())


async def test_an_address_taken_by_a_transaction_not_yet_committed_is_waited_for_and_skipped(db):
    """Two coordinators both see the same next address: the second's insert waits for the first's
    transaction (the primary key) and, once it commits, takes the next address; never both the same."""
    pool = ipam.Pool.parse("10.8.0.0/24")
    await alloc(db, pool, "o0")
    async with db.transaction() as first:
        got_first = await ipam.allocate(first, pool, "first", now=1000.0)
        second = asyncio.create_task(alloc(db, pool, "second"))
        await wait_until(lambda: another_waits(db), what="the second to wait for the first's address")
    got_second = await second
    assert (got_first, got_second) == (pool.to_str(pool.first + 1), pool.to_str(pool.first + 2))


async def test_losing_a_race_for_a_quarantined_address_takes_the_next_one(db):
    """Two transactions reusing quarantined addresses at once: the one that waited on the
    other's row lock gets the next expired address, not a false 'network exhausted'
    (PostgreSQL re-checks the locked row only, so the loser's UPDATE matches nothing)."""
    pool = ipam.Pool.parse("10.7.0.0/29")  # 6 usable addresses
    held = [await alloc(db, pool, f"o{i}") for i in range(6)]
    await release(db, pool, held[1], now=1000, quarantine=10)
    await release(db, pool, held[4], now=1000, quarantine=10)
    async with db.transaction() as first:
        got_first = await ipam.allocate(first, pool, "first", now=2000)
        second = asyncio.create_task(alloc(db, pool, "second", now=2000))
        await wait_until(lambda: another_waits(db), what="the second to wait for the row the first one took")
    got_second = await second
    assert {got_first, got_second} == {held[1], held[4]}
