"""Resolver: cluster names go to the configured DNS server (a real UDP server here), others to the system."""

from __future__ import annotations

import pytest

from anex_agent.errors import ConfigError, ResolveError
from anex_agent.net.resolver import DnsServer, Resolver, parse_dns_server
from anex_agent.wire.nodes import NodeConfig
from frontends.servers import free_port, tiny_dns

RECORDS = {
    "web.default.svc.cluster.local": ["10.96.0.10"],
    "dual.default.svc.cluster.local": ["10.96.0.11", "fd00::11"],
    "db.corp.internal": ["10.97.0.5"],
}


async def test_cluster_name_goes_to_cluster_dns_and_is_cached():
    async with tiny_dns(RECORDS) as server:
        resolver = Resolver([f"127.0.0.1:{server.port}"])
        assert await resolver.resolve("web.default.svc.cluster.local") == ["10.96.0.10"]
        asked = list(server.queries)
        assert ("web.default.svc.cluster.local", "A") in asked
        # within the TTL the answer comes from the cache: the server is not asked again
        assert await resolver.resolve("WEB.default.svc.cluster.local.") == ["10.96.0.10"]
        assert server.queries == asked


async def test_zero_ttl_is_not_cached():
    async with tiny_dns(RECORDS, ttl=0) as server:
        resolver = Resolver([f"127.0.0.1:{server.port}"])
        await resolver.resolve("web.default.svc.cluster.local")
        await resolver.resolve("web.default.svc.cluster.local")
        # the A answer (TTL 0) is asked twice; the empty AAAA answer is negatively cached
        assert server.queries.count(("web.default.svc.cluster.local", "A")) == 2
        assert server.queries.count(("web.default.svc.cluster.local", "AAAA")) == 1


async def test_ipv4_first_then_ipv6():
    async with tiny_dns(RECORDS) as server:
        resolver = Resolver([f"127.0.0.1:{server.port}"])
        assert await resolver.resolve("dual.default.svc.cluster.local") == ["10.96.0.11", "fd00::11"]


async def test_other_names_go_to_the_system_resolver():
    async with tiny_dns(RECORDS) as server:
        resolver = Resolver([f"127.0.0.1:{server.port}"])
        addresses = await resolver.resolve("localhost")
        assert "127.0.0.1" in addresses or "::1" in addresses
        assert server.queries == []


async def test_ip_literals_skip_dns():
    async with tiny_dns(RECORDS) as server:
        resolver = Resolver([f"127.0.0.1:{server.port}"])
        assert await resolver.resolve("10.1.2.3") == ["10.1.2.3"]
        assert await resolver.resolve("[fd00::1]") == ["fd00::1"]
        assert server.queries == []


async def test_nxdomain_names_the_host_and_the_server():
    async with tiny_dns(RECORDS) as server:
        resolver = Resolver([f"127.0.0.1:{server.port}"])
        with pytest.raises(ResolveError) as info:
            await resolver.resolve("nosuch.default.svc.cluster.local")
        assert info.value.host == "nosuch.default.svc.cluster.local"
        assert "NXDOMAIN" in info.value.reason
        assert f"127.0.0.1:{server.port}" in info.value.reason
        # the negative answer is cached too
        count = len(server.queries)
        with pytest.raises(ResolveError):
            await resolver.resolve("nosuch.default.svc.cluster.local")
        assert len(server.queries) == count


async def test_search_domains_are_cluster_suffixes_and_expand_short_names():
    async with tiny_dns(RECORDS) as server:
        resolver = Resolver(
            [f"127.0.0.1:{server.port}"], search_domains=["svc.cluster.local", "corp.internal"]
        )
        assert resolver.is_cluster_name("db.corp.internal")
        assert await resolver.resolve("db.corp.internal") == ["10.97.0.5"]
        # "web.default" is not a system name; it is found under a search domain
        assert await resolver.resolve("web.default") == ["10.96.0.10"]
        assert ("web.default.svc.cluster.local", "A") in server.queries


async def test_silent_cluster_dns_is_reported_as_not_answering():
    port = free_port()  # nothing listens there: queries go unanswered
    resolver = Resolver([f"127.0.0.1:{port}"], timeout=1.0)
    with pytest.raises(ResolveError) as info:
        await resolver.resolve("web.default.svc.cluster.local")
    assert "did not answer" in info.value.reason


async def test_from_node_config():
    config = NodeConfig(
        node_id="n1", version=1, address="10.254.0.2", network="10.254.0.0/16", mtu=1420,
        dns=["10.254.254.1"], search_domains=["default.svc.cluster.local"], gateways=[],
    )
    resolver = Resolver.from_node_config(config)
    assert resolver.cluster_dns == [DnsServer("10.254.254.1", 53)]
    assert resolver.is_cluster_name("x.default.svc.cluster.local")
    assert resolver.is_cluster_name("cluster.local")
    assert not resolver.is_cluster_name("pypi.org")
    assert not resolver.is_cluster_name("notcluster.local")


@pytest.mark.parametrize(
    "text, expected",
    [("10.0.0.1", DnsServer("10.0.0.1", 53)), ("10.0.0.1:5353", DnsServer("10.0.0.1", 5353)),
     ("fd00::1", DnsServer("fd00::1", 53)), ("[fd00::1]:54", DnsServer("fd00::1", 54))],
)
def test_parse_dns_server(text, expected):
    assert parse_dns_server(text) == expected


@pytest.mark.parametrize("text", ["dns.example", "10.0.0.1:0", "10.0.0.1:x", "[fd00::1", "",
                                  "10.0.0.1:²", "10.0.0.1:①", "10.0.0.1:٣", "10.0.0.1:３", "10.0.0.1:65536",
                                  "[10.0.0.1]:53", ":53"])
def test_parse_dns_server_rejects_with_a_clear_message(text):
    with pytest.raises(ConfigError) as info:
        parse_dns_server(text, source="NodeConfig.dns")
    assert "NodeConfig.dns" in str(info.value)
    assert str(info.value).startswith(f"NodeConfig.dns: {text!r} must be an IP address")


def test_resolver_refuses_an_odd_port_with_a_config_error_not_a_crash():
    with pytest.raises(ConfigError, match="dns: '10.0.0.1:²'"):
        Resolver(["10.0.0.1:²"])


@pytest.mark.parametrize("server", ["10.0.0.1:²", "10.0.0.1:٣", "10.0.0.1:0", "dns.example", "[10.0.0.1]:53"])
def test_node_config_refuses_a_dns_server_the_resolver_could_not_use(server):
    """Checked where the node config is read, before it reaches the data plane."""
    import pydantic

    with pytest.raises(pydantic.ValidationError, match="must be an IP address"):
        NodeConfig(node_id="n", version=1, address="10.254.0.7", network="10.254.0.0/16", mtu=1380, dns=[server],
                   gateways=[])
    assert NodeConfig(node_id="n", version=1, address="10.254.0.7", network="10.254.0.0/16", mtu=1380,
                      dns=["10.0.0.1", "[fd00::1]:5353"], gateways=[]).dns == ["10.0.0.1", "[fd00::1]:5353"]


class _Transport:
    """A DNS transport answering from a table (as the built-in engine's stack would carry them)."""

    def __init__(self, records: dict[str, str], *, silent: bool = False) -> None:
        self.records, self.silent, self.asked = records, silent, []

    async def exchange(self, wire: bytes, address: str, port: int, timeout: float) -> bytes:
        import dns.message
        import dns.rcode
        import dns.rrset

        self.asked.append((address, port))
        if self.silent:
            raise OSError("the mesh is not up yet")  # at once, as the stack's transport without a tunnel
        query = dns.message.from_wire(wire)
        reply = dns.message.make_response(query)
        name = str(query.question[0].name).rstrip(".")
        if name not in self.records:
            reply.set_rcode(dns.rcode.NXDOMAIN)
        elif query.question[0].rdtype == 1:  # A
            reply.answer.append(dns.rrset.from_text(query.question[0].name, 30, "IN", "A", self.records[name]))
        return reply.to_wire()


async def test_cluster_queries_go_through_a_transport_given_to_the_slot():
    from anex_agent.net.resolver import ResolverSlot

    transport = _Transport({"db.default.svc.cluster.local": "10.96.0.9"})
    slot = ResolverSlot()
    slot.use_transport(transport)
    slot.use(Resolver(["10.254.0.1"], timeout=1))  # a resolver put in later uses it too
    assert await slot.resolve("db.default.svc.cluster.local") == ["10.96.0.9"]
    assert transport.asked and transport.asked[0] == ("10.254.0.1", 53)
    with pytest.raises(ResolveError, match="NXDOMAIN"):
        await slot.resolve("nosuch.default.svc.cluster.local")


async def test_a_silent_transport_is_reported_as_not_answering():
    resolver = Resolver(["10.254.0.1"], timeout=0.6)
    transport = resolver.dns_transport = _Transport({}, silent=True)
    with pytest.raises(ResolveError, match="did not answer"):
        await resolver.resolve("x.default.svc.cluster.local")
    assert len(transport.asked) < 20  # retried a few times, not spun on the event loop
