"""Message parsing: exact sizes, reserved bytes, round trips; random bytes raise only our error."""

import os

import pytest
from hypothesis import given, settings, strategies as st

from anex_agent.errors import RemoteProtocolError
from anex_agent.wg import messages
from anex_agent.wg.messages import CookieReply, Initiation, Response, Transport, parse


def _initiation():
    return Initiation(0xDEADBEEF, os.urandom(32), os.urandom(48), os.urandom(28), os.urandom(16), os.urandom(16))


def _response():
    return Response(1, 2, os.urandom(32), os.urandom(16), os.urandom(16), os.urandom(16))


def test_round_trips_and_sizes():
    for msg, size in ((_initiation(), 148), (_response(), 92), (CookieReply(9, os.urandom(24), os.urandom(32)), 64),
                      (Transport(5, 2**64 - 1, os.urandom(48)), 64)):
        data = msg.to_bytes()
        assert len(data) == size
        assert parse(data) == msg


@pytest.mark.parametrize("make", [_initiation, _response, lambda: CookieReply(9, os.urandom(24), os.urandom(32))])
def test_wrong_lengths_are_refused(make):
    data = make().to_bytes()
    for bad in (data[:-1], data + b"\0", data[:4]):
        with pytest.raises(RemoteProtocolError, match="exactly"):
            parse(bad)


def test_transport_minimum_and_keepalive():
    keepalive = Transport(1, 0, os.urandom(16)).to_bytes()
    assert len(keepalive) == 32 and parse(keepalive).encrypted_packet == keepalive[16:]
    with pytest.raises(RemoteProtocolError, match="minimum"):
        parse(keepalive[:-1])


@pytest.mark.parametrize("data,reason", [
    (b"", "shorter"), (b"\x01\x00\x00", "shorter"), (b"\x05\x00\x00\x00" + bytes(60), "unknown message type"),
    (b"\x00\x00\x00\x00" + bytes(60), "unknown message type"),
    (b"\x01\x00\x01\x00" + bytes(144), "reserved"), (b"\x04\x01\x00\x00" + bytes(40), "reserved"),
])
def test_bad_headers(data, reason):
    with pytest.raises(RemoteProtocolError, match=reason):
        parse(data)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_raise_only_remote_protocol_error(data):
    try:
        msg = parse(data)
    except RemoteProtocolError:
        return
    assert msg.to_bytes() == data  # whatever parses, serialises back to the same bytes


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([1, 2, 3, 4]), st.binary(max_size=200))
def test_random_bodies_with_valid_types(kind, body):
    data = bytes([kind, 0, 0, 0]) + body
    try:
        assert parse(data).to_bytes() == data
    except RemoteProtocolError:
        pass


def test_transport_bytes_matches_dataclass():
    assert messages.transport_bytes(7, 9, b"x" * 16) == Transport(7, 9, b"x" * 16).to_bytes()
