"""Name resolution for the dialer: cluster names over the mesh, other names as configured.

Routing of a name (lower-cased, trailing dot removed):

1. an IP literal is returned as it is (no DNS);
2. a name equal to or under one of the *cluster suffixes* (``cluster.local`` and the
   ``search_domains`` of :class:`anex_agent.wire.nodes.NodeConfig`) is asked, A and AAAA, to the
   *cluster DNS servers* (``NodeConfig.dns``: the gateway, reached over the mesh) with
   dnspython's async resolver; answers are cached for their TTL;
3. any other name goes to the *system resolver* (``getaddrinfo``: /etc/hosts and
   /etc/resolv.conf of the machine); when that fails and search domains are configured,
   the name is tried once more under each search domain through the cluster DNS
   (so ``myservice.default`` works as it does inside a pod).

Failures raise :class:`anex_agent.errors.ResolveError` naming the host, with a reason
fit for a 502 body.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from anex_agent import parse
from anex_agent.errors import ResolveError, config_value

log = logging.getLogger(__name__)

DEFAULT_CLUSTER_SUFFIXES = ("cluster.local",)
DNS_PORT = 53  # RFC 1035 §4.2
DEFAULT_TIMEOUT = 5.0  # seconds for one cluster lookup (all servers, retries included)
NEGATIVE_TTL = 5.0  # seconds an NXDOMAIN/NODATA answer is remembered (RFC 2308 §5 allows caching it)
MAX_CACHE_ENTRIES = 4096
RDTYPE_A = 1  # RFC 1035 §3.2.2
RDTYPE_AAAA = 28  # RFC 3596 §2.1


class DnsTransport(Protocol):
    """Carries DNS queries where the OS cannot (the built-in engine's user-space stack)."""

    async def exchange(self, wire: bytes, address: str, port: int, timeout: float) -> bytes:
        """Send one query over UDP to ``address:port`` and return the answer; raise TimeoutError or OSError."""
        ...


@dataclass(frozen=True)
class DnsServer:
    address: str
    port: int = DNS_PORT

    def __str__(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return host if self.port == DNS_PORT else f"{host}:{self.port}"


def parse_dns_server(value: str, *, source: str = "dns") -> DnsServer:
    """Parse ``IP``, ``IP:PORT``, ``IPv6`` or ``[IPv6]:PORT`` into a :class:`DnsServer`; ConfigError naming ``source``."""
    return DnsServer(*config_value(source, parse.ip_port, value.strip(), default_port=DNS_PORT))


def _normalise(name: str) -> str:
    return name.strip().rstrip(".").lower()


def _ip_literal(host: str) -> str | None:
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


class Resolver:
    """Resolves host names to IP address strings; see the module docstring for the routing.

    ``cluster_dns``: servers for cluster names (empty: cluster names go to the system too).
    ``search_domains``: also cluster suffixes, and tried for names the system cannot resolve.
    ``use_system``: whether non-cluster names go to the system resolver (True by default).
    """

    def __init__(
        self,
        cluster_dns: Iterable[str | DnsServer] = (),
        *,
        search_domains: Sequence[str] = (),
        cluster_suffixes: Sequence[str] = DEFAULT_CLUSTER_SUFFIXES,
        use_system: bool = True,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.cluster_dns = [s if isinstance(s, DnsServer) else parse_dns_server(s) for s in cluster_dns]
        self.search_domains = [_normalise(d) for d in search_domains if _normalise(d)]
        self.cluster_suffixes = tuple(dict.fromkeys([_normalise(s) for s in cluster_suffixes] + self.search_domains))
        self.use_system = use_system
        self.timeout = timeout
        self._cache: dict[tuple[str, int], tuple[float, list[str]]] = {}
        self._dns: Any = None  # dns.asyncresolver.Resolver, made at the first cluster query (dnspython is imported then)
        #: When set, cluster queries go through it instead of OS sockets (see :meth:`ResolverSlot.use_transport`).
        self.dns_transport: DnsTransport | None = None

    def _dns_resolver(self) -> Any:
        """dnspython's resolver for :attr:`cluster_dns`, made (and dnspython imported) on first use:
        an agent that never looks a cluster name up does not carry dnspython."""
        if self._dns is None:
            import dns.asyncresolver
            import dns.nameserver

            res = dns.asyncresolver.Resolver(configure=False)
            res.nameservers = [dns.nameserver.Do53Nameserver(s.address, s.port) for s in self.cluster_dns]
            res.lifetime = self.timeout
            res.timeout = max(self.timeout / 3, 0.5)
            res.cache = None  # our own cache below also remembers negative answers
            self._dns = res
        return self._dns

    @classmethod
    def from_node_config(cls, config, **kwargs) -> Resolver:
        """Build from a :class:`anex_agent.wire.nodes.NodeConfig` (``dns`` and ``search_domains``)."""
        return cls(config.dns, search_domains=config.search_domains, **kwargs)

    def is_cluster_name(self, host: str) -> bool:
        name = _normalise(host)
        return any(name == s or name.endswith("." + s) for s in self.cluster_suffixes)

    async def resolve(self, host: str) -> list[str]:
        """IP address strings for ``host``, IPv4 first; raise :class:`ResolveError`."""
        literal = _ip_literal(host)
        if literal is not None:
            return [literal]
        name = _normalise(host)
        if not name:
            raise ResolveError(host, 0, "empty host name")
        if self.cluster_dns and self.is_cluster_name(name):
            return await self._resolve_cluster(host, name)
        if not self.use_system:
            raise ResolveError(host, 0, "not a cluster name and system resolution is disabled")
        try:
            return await self._resolve_system(host, name)
        except ResolveError as err:
            if not self.cluster_dns or not self.search_domains:
                raise
            for domain in self.search_domains:
                try:
                    return await self._resolve_cluster(host, f"{name}.{domain}")
                except ResolveError:
                    continue
            raise err from None

    async def _resolve_system(self, host: str, name: str) -> list[str]:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(name, None, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
                raise ResolveError(host, 0, "name does not resolve (system resolver)") from None
            raise ResolveError(host, 0, "system resolver failed (temporary failure in name resolution)") from None
        out = list(dict.fromkeys(info[4][0] for info in infos))
        out.sort(key=lambda a: ":" in a)  # IPv4 first: the mesh is IPv4
        return out

    async def _resolve_cluster(self, host: str, name: str) -> list[str]:
        a, aaaa = await asyncio.gather(
            self._query(host, name, RDTYPE_A), self._query(host, name, RDTYPE_AAAA)
        )
        if isinstance(a, ResolveError) and isinstance(aaaa, ResolveError):
            # prefer the more informative failure: an unreachable server over "no such name"
            raise aaaa if "NXDOMAIN" in a.reason else a
        out = (a if isinstance(a, list) else []) + (aaaa if isinstance(aaaa, list) else [])
        if not out:
            raise ResolveError(host, 0, f"name has no address in cluster DNS ({self._servers_text()})")
        return out

    def _servers_text(self) -> str:
        return ", ".join(str(s) for s in self.cluster_dns)

    async def _query(self, host: str, name: str, rdtype: int) -> list[str] | ResolveError:
        key = (name, rdtype)
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return list(hit[1])
        assert self.cluster_dns
        if self.dns_transport is not None:
            return await self._query_transport(host, name, rdtype, key)
        import dns.exception
        import dns.resolver

        try:
            answer = await self._dns_resolver().resolve(name, rdtype, search=False, raise_on_no_answer=False)
        except dns.resolver.NXDOMAIN:
            self._store(key, NEGATIVE_TTL, [])
            return ResolveError(host, 0, f"name does not resolve (NXDOMAIN from cluster DNS {self._servers_text()})")
        except (dns.exception.Timeout, dns.resolver.NoNameservers, dns.resolver.LifetimeTimeout):
            return ResolveError(host, 0, f"cluster DNS {self._servers_text()} did not answer (is the mesh up?)")
        except dns.exception.DNSException:
            return ResolveError(host, 0, f"cluster DNS {self._servers_text()} gave an unusable answer")
        addresses = [rr.address for rr in answer.rrset] if answer.rrset is not None else []
        ttl = float(answer.rrset.ttl) if answer.rrset is not None else NEGATIVE_TTL
        self._store(key, ttl, addresses)
        return addresses

    async def _query_transport(self, host: str, name: str, rdtype: int, key: tuple[str, int]) -> list[str] | ResolveError:
        """One lookup through :attr:`dns_transport`: each server in turn, until ``timeout`` is spent."""
        assert self.dns_transport is not None
        import dns.exception
        import dns.message
        import dns.rcode

        deadline = time.monotonic() + self.timeout
        attempt = max(self.timeout / 3, 0.5)
        while time.monotonic() < deadline:
            for server in self.cluster_dns:
                query = dns.message.make_query(name, rdtype)
                try:
                    data = await self.dns_transport.exchange(query.to_wire(), server.address, server.port,
                                                             min(attempt, max(0.05, deadline - time.monotonic())))
                    response = dns.message.from_wire(data)
                except OSError:  # failed at once (the tunnel is not up): do not spin, try again shortly
                    await asyncio.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
                    continue
                except (TimeoutError, dns.exception.DNSException):
                    continue
                if not query.is_response(response):
                    continue
                if response.rcode() == dns.rcode.NXDOMAIN:
                    self._store(key, NEGATIVE_TTL, [])
                    return ResolveError(host, 0, f"name does not resolve (NXDOMAIN from cluster DNS {self._servers_text()})")
                if response.rcode() != dns.rcode.NOERROR:
                    return ResolveError(host, 0, f"cluster DNS {self._servers_text()} gave an unusable answer")
                try:
                    chain = response.resolve_chaining()
                except dns.exception.DNSException:
                    return ResolveError(host, 0, f"cluster DNS {self._servers_text()} gave an unusable answer")
                rrset = chain.answer
                addresses = [rr.address for rr in rrset] if rrset is not None else []
                self._store(key, float(chain.minimum_ttl) if rrset is not None else NEGATIVE_TTL, addresses)
                return addresses
        return ResolveError(host, 0, f"cluster DNS {self._servers_text()} did not answer (is the mesh up?)")

    def _store(self, key: tuple[str, int], ttl: float, addresses: list[str]) -> None:
        if ttl <= 0:
            return
        if len(self._cache) >= MAX_CACHE_ENTRIES:
            now = time.monotonic()
            self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
            if len(self._cache) >= MAX_CACHE_ENTRIES:
                self._cache.clear()
        self._cache[key] = (time.monotonic() + ttl, addresses)


class ResolverSlot:
    """A :class:`anex_agent.net.dialer.NameResolver` whose answers come from a resolver that can be replaced.

    The data plane gives one slot to the engine's dialer for good and puts a new
    :class:`Resolver` into it when the node's DNS config changes (:meth:`use`): the dialer
    is never reached into, and connections being resolved finish with the resolver they began with.
    """

    def __init__(self, resolver: Resolver | None = None) -> None:
        self.current = resolver or Resolver()
        self._transport: DnsTransport | None = None

    def use(self, resolver: Resolver) -> None:
        """Answer with ``resolver`` from now on."""
        if self._transport is not None:
            resolver.dns_transport = self._transport
        self.current = resolver

    def use_transport(self, transport: DnsTransport | None) -> None:
        """Send cluster DNS queries through ``transport`` (the built-in engine's stack), now and for
        every resolver put in later; None: OS sockets again."""
        self._transport = transport
        self.current.dns_transport = transport

    async def resolve(self, host: str) -> list[str]:
        return await self.current.resolve(host)
