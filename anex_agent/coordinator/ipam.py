"""IP address management for the mesh network.

Contract:
* Addresses are handed out sequentially from the first usable address of the
  network (network address and broadcast excluded); nodes and gateways draw from
  the same pool, so a gateway's address is never given to a node. Finding the next
  one is an index lookup, not a scan (measured at 60,000 nodes: about 1 ms instead of
  15 ms on SQLite and 60-90 ms on PostgreSQL).
* A freed address is *quarantined* until ``now + quarantine`` and only then reused
  (lowest first), so packets or peers still aimed at the old owner do not reach a
  new one.
* Uniqueness is the database's job: ``addresses.n`` is the primary key and
  :func:`allocate` inserts with ``ON CONFLICT DO NOTHING`` and retries with the
  next candidate. Two coordinators on one PostgreSQL therefore never hand out one
  address twice, whatever their timing.
* :func:`allocate` must run inside the caller's transaction, so a failed join
  leaves no address behind.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from anex_agent.coordinator.db import Conn
from anex_agent import parse
from anex_agent.errors import AnexError, ConfigError, config_value

_MAX_ATTEMPTS = 1000


class NetworkExhausted(AnexError):
    """No free (or quarantine-expired) address is left in the mesh network."""


@dataclass(frozen=True)
class Pool:
    """The usable range of an IPv4 mesh network as integers (pure)."""

    network: ipaddress.IPv4Network

    @classmethod
    def parse(cls, cidr: str, *, source: str = "--network") -> Pool:
        net = config_value(source, parse.cidr, cidr)
        if not isinstance(net, ipaddress.IPv4Network):
            raise ConfigError(source, "must be an IPv4 network (the mesh is IPv4), e.g. 10.254.0.0/16")
        if net.prefixlen > 30:
            raise ConfigError(source, f"/{net.prefixlen} is too small; use a prefix of /30 or shorter")
        return cls(net)

    @property
    def first(self) -> int:
        return int(self.network.network_address) + 1

    @property
    def last(self) -> int:
        return int(self.network.broadcast_address) - 1

    @property
    def size(self) -> int:
        return self.last - self.first + 1

    def to_str(self, n: int) -> str:
        return str(ipaddress.IPv4Address(n))

    def to_int(self, address: str) -> int:
        n = int(ipaddress.IPv4Address(address))
        if not self.first <= n <= self.last:
            raise ValueError(f"{address} is not a usable address of {self.network}")
        return n

    @property
    def cidr(self) -> str:
        return str(self.network)


_NEXT_AFTER_TOP = "SELECT COALESCE(MAX(n) + 1, CAST($1 AS BIGINT)) AS c FROM addresses WHERE n >= $1 AND n <= $2"

_NEXT_GAP = """
SELECT c FROM (
    SELECT CAST($1 AS BIGINT) AS c WHERE NOT EXISTS (SELECT 1 FROM addresses WHERE n = $1)
    UNION ALL
    SELECT a.n + 1 AS c FROM addresses a
     WHERE a.n >= $1 AND a.n < $2
       AND NOT EXISTS (SELECT 1 FROM addresses b WHERE b.n = a.n + 1)
) gaps ORDER BY c LIMIT 1
"""

_REUSE_QUARANTINED = """
UPDATE addresses SET owner = $1, quarantined_until = NULL
 WHERE owner IS NULL AND n = (
    SELECT n FROM addresses
     WHERE owner IS NULL AND quarantined_until <= $2 AND n >= $3 AND n <= $4
     ORDER BY n LIMIT 1)
RETURNING n
"""

_ANY_REUSABLE = """
SELECT 1 FROM addresses WHERE owner IS NULL AND quarantined_until <= $1 AND n >= $2 AND n <= $3 LIMIT 1
"""


async def allocate(tx: Conn, pool: Pool, owner: str, *, now: float) -> str:
    """Reserve the next free address for ``owner`` inside ``tx``; raise NetworkExhausted.

    Order: the address after the highest one in the table (an index lookup: the table is
    dense, since a freed address stays as a quarantine row), then any gap below it (a
    scan; gaps appear only when rows were removed by hand or the network was changed),
    then quarantined addresses whose quarantine is over, lowest first (losing one of those to
    a concurrent transaction means trying the next, not "exhausted").
    """
    for _ in range(_MAX_ATTEMPTS):
        candidate = await tx.fetchval(_NEXT_AFTER_TOP, pool.first, pool.last)
        if candidate is None or candidate > pool.last:
            candidate = await tx.fetchval(_NEXT_GAP, pool.first, pool.last)
        if candidate is not None and pool.first <= candidate <= pool.last:
            got = await tx.fetchval(
                "INSERT INTO addresses (n, owner) VALUES ($1, $2) ON CONFLICT (n) DO NOTHING RETURNING n",
                candidate,
                owner,
            )
            if got is not None:
                return pool.to_str(got)
            continue  # another coordinator took it first: look again
        got = await tx.fetchval(_REUSE_QUARANTINED, owner, now, pool.first, pool.last)
        if got is not None:
            return pool.to_str(got)
        if await tx.fetchval(_ANY_REUSABLE, now, pool.first, pool.last) is not None:
            # PostgreSQL: we waited on a row another transaction reused and the re-check of
            # that one row failed; other expired addresses are still there: look again
            continue
        raise NetworkExhausted(
            f"no free address left in {pool.cidr} ({pool.size} usable addresses; freed ones are quarantined "
            "before reuse); delete unused nodes or restart the coordinator with a larger --network"
        )
    raise NetworkExhausted(f"could not reserve an address in {pool.cidr} after {_MAX_ATTEMPTS} attempts")


async def release(tx: Conn, pool: Pool, address: str, *, now: float, quarantine: float) -> None:
    """Free ``address`` inside ``tx``; it becomes reusable at ``now + quarantine``."""
    await tx.execute(
        "UPDATE addresses SET owner = NULL, quarantined_until = $2 WHERE n = $1",
        int(ipaddress.IPv4Address(address)),
        now + quarantine,
    )
