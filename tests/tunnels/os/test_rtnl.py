"""rtnetlink encoding and decoding (no privileges): requests as the kernel reads them, answers as it writes them."""

from __future__ import annotations

import socket
import struct

import pytest

from anex_agent.tunnels.os import rtnl


def _nlmsg(msg_type: int, payload: bytes, seq: int = 7, flags: int = 0) -> bytes:
    raw = struct.pack("=IHHII", 16 + len(payload), msg_type, flags, seq, 0) + payload
    return raw + b"\0" * (-len(raw) % 4)


def test_route_request_carries_destination_oif_table_and_our_protocol():
    body = rtnl.route_request("10.96.1.1/12", oif=5, proto=0x61)
    family, dst_len, _src, _tos, table, proto, scope, rtype, _flags = struct.unpack_from("=BBBBBBBBI", body)
    assert (family, dst_len, table, proto, scope, rtype) == (socket.AF_INET, 12, 254, 0x61, 0, 1)
    found = rtnl.attrs(body, 12)
    assert found[rtnl.RTA_DST] == bytes([10, 96, 0, 0])  # the network, host bits cleared
    assert struct.unpack("=I", found[rtnl.RTA_OIF]) == (5,)


def test_default_route_has_no_destination_and_deletion_matches_any_scope():
    body = rtnl.route_request("::/0", oif=3, proto=0x61, delete=True)
    family, dst_len, *_rest, scope, _type, _flags = struct.unpack_from("=BBBBBBBBI", body)
    assert (family, dst_len, scope) == (socket.AF_INET6, 0, rtnl.RT_SCOPE_NOWHERE)
    assert rtnl.RTA_DST not in rtnl.attrs(body, 12)


def test_ipv4_address_request_sets_local_and_address_ipv6_only_address():
    v4 = rtnl.addr_request(4, "10.9.0.2/24")
    assert struct.unpack_from("=BBBBI", v4) == (socket.AF_INET, 24, 0, 0, 4)
    assert rtnl.attrs(v4, 8) == {rtnl.IFA_LOCAL: bytes([10, 9, 0, 2]), rtnl.IFA_ADDRESS: bytes([10, 9, 0, 2])}
    v6 = rtnl.addr_request(4, "fd00::5/64")
    assert struct.unpack_from("=BBBBI", v6)[:2] == (socket.AF_INET6, 64)
    assert set(rtnl.attrs(v6, 8)) == {rtnl.IFA_ADDRESS}


def test_link_request_nests_the_kind_in_linkinfo_and_sets_up_through_flags_and_change():
    body = rtnl.link_request(name="anex0", kind="wireguard")
    found = rtnl.attrs(body, 16)
    assert found[rtnl.IFLA_IFNAME] == b"anex0\0"
    assert rtnl.attrs(found[rtnl.IFLA_LINKINFO]) == {rtnl.IFLA_INFO_KIND: b"wireguard"}
    up = rtnl.link_request(index=9, up=True, mtu=1380)
    assert struct.unpack_from("=BxHiII", up) == (0, 0, 9, rtnl.IFF_UP, rtnl.IFF_UP)
    assert struct.unpack("=I", rtnl.attrs(up, 16)[rtnl.IFLA_MTU]) == (1380,)


def test_decode_parses_a_kernel_link_answer_with_nested_flagged_attributes():
    linkinfo = rtnl.attr(rtnl.IFLA_INFO_KIND, b"tun\0")
    payload = (struct.pack("=BxHiII", 0, 65534, 3, 0x1001, 0) + rtnl.attr(rtnl.IFLA_IFNAME, b"anex0\0")
               + rtnl.attr(rtnl.IFLA_MTU, struct.pack("=I", 1420))
               + rtnl.attr(rtnl.IFLA_LINKINFO | 0x8000, linkinfo))  # NLA_F_NESTED as the kernel sets it
    datagram = _nlmsg(rtnl.RTM_NEWLINK, payload, flags=2) + _nlmsg(rtnl.NLMSG_DONE, struct.pack("=i", 0), flags=2)
    messages = rtnl.decode(datagram)
    assert [m[0] for m in messages] == [rtnl.RTM_NEWLINK, rtnl.NLMSG_DONE]
    assert rtnl.parse_link(messages[0][3]) == rtnl.Link(index=3, name="anex0", mtu=1420, flags=0x1001, kind="tun")


def test_parse_route_reads_the_table_attribute_over_the_header_and_defaults_the_destination():
    payload = struct.pack("=BBBBBBBBI", socket.AF_INET6, 0, 0, 0, 252, 0x61, 0, 1, 0)
    payload += rtnl.attr(rtnl.RTA_TABLE, struct.pack("=I", 1000)) + rtnl.attr(rtnl.RTA_OIF, struct.pack("=I", 7))
    assert rtnl.parse_route(payload) == rtnl.Route(family=socket.AF_INET6, dst="::", dst_len=0, table=1000,
                                                   proto=0x61, oif=7)


class _FakeSocket:
    def __init__(self, answers: list[bytes]) -> None:
        self.answers, self.sent = answers, []

    def send(self, data: bytes) -> int:
        self.sent.append(data)
        return len(data)

    def recv_into(self, buffer: bytearray, nbytes: int, flags: int) -> int:
        assert flags == socket.MSG_PEEK | socket.MSG_TRUNC
        return len(self.answers[0])  # the real size, as the kernel reports it under MSG_TRUNC

    def recv(self, size: int) -> bytes:
        assert size >= len(self.answers[0]), "a datagram read with a buffer too small for it"
        return self.answers.pop(0)

    def close(self) -> None:
        pass


def _fake(answers: list[bytes]) -> rtnl.Rtnl:
    nl = rtnl.Rtnl.__new__(rtnl.Rtnl)
    nl._sock, nl._seq = _FakeSocket(answers), 0
    return nl


def test_request_asks_for_an_ack_and_raises_the_kernels_errno():
    nl = _fake([_nlmsg(rtnl.NLMSG_ERROR, struct.pack("=i", -17) + b"\0" * 16, seq=1)])
    with pytest.raises(rtnl.NetlinkError) as caught:
        nl.link_add("anex0", "wireguard")
    assert caught.value.errno == 17
    _len, _type, flags, seq, _pid = struct.unpack_from("=IHHII", nl._sock.sent[0])
    assert flags & rtnl.NLM_F_ACK and flags & rtnl.NLM_F_CREATE and flags & rtnl.NLM_F_EXCL and seq == 1


def test_dump_reads_every_datagram_to_done_and_skips_stale_answers():
    def link(index: int, name: str) -> bytes:
        return _nlmsg(rtnl.RTM_NEWLINK, struct.pack("=BxHiII", 0, 1, index, 0, 0)
                      + rtnl.attr(rtnl.IFLA_IFNAME, name.encode() + b"\0"), seq=1, flags=2)

    stale = _nlmsg(rtnl.NLMSG_ERROR, struct.pack("=i", -1), seq=0)
    nl = _fake([stale + link(1, "lo"), link(5, "anex0"), _nlmsg(rtnl.NLMSG_DONE, struct.pack("=i", 0), seq=1)])
    assert [(l.index, l.name) for l in nl.links()] == [(1, "lo"), (5, "anex0")]


def test_a_datagram_bigger_than_the_buffer_is_read_whole():
    huge = _nlmsg(rtnl.RTM_NEWLINK, struct.pack("=BxHiII", 0, 1, 9, 0, 0)
                  + rtnl.attr(rtnl.IFLA_IFNAME, b"anex9\0") + rtnl.attr(999, b"x" * 30000) * 4, seq=1, flags=2)
    assert len(huge) > 3 * rtnl.RECV_SIZE
    nl = _fake([huge, _nlmsg(rtnl.NLMSG_DONE, struct.pack("=i", 0), seq=1)])
    assert [(l.index, l.name) for l in nl.links()] == [(9, "anex9")]
