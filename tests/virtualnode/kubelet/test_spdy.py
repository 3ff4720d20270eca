"""The SPDY/3.1 core: pairs over a fake link, header compression against frames moby/spdystream
wrote (the framer kubectl and the API server use), flow control, protocol errors."""

from __future__ import annotations

import ast
import struct
import zlib
from pathlib import Path

import pytest

from anex_agent.errors import LocalProtocolError
from anex_agent.virtualnode.kubelet.streams import spdy
from anex_agent.virtualnode.kubelet.streams.spdy_dictionary import ADLER32, DICTIONARY

# Written by github.com/moby/spdystream v0.5.1's spdy.Framer, one framer, in this order: its
# header compression context runs across the three control frames.
GO_SYN1 = bytes.fromhex("80030001000000290000000100000000000078f9e3c6a7c26260606004a7b392a2d4c45c6851c29a0a"
                        "0a6800000000ffff")  # SYN_STREAM 1 {streamtype: error}
GO_SYN3 = bytes.fromhex("800300010000001900000003000000000000c22ac5565c92925f5a02000000ffff")  # stdout
GO_REPLY1 = bytes.fromhex("800300020000000e000000016260606000000000ffff")  # SYN_REPLY 1 {}
GO_DATA3_FIN = bytes.fromhex("00000003010000026869")  # DATA 3 "hi" FIN
GO_WINDOW3 = bytes.fromhex("80030009000000080000000300001000")  # WINDOW_UPDATE 3 +4096
GO_GOAWAY5 = bytes.fromhex("80030007000000080000000500000000")
GO_RST5_CANCEL = bytes.fromhex("80030003000000080000000500000005")


def pair(**server_options) -> tuple[spdy.Connection, spdy.Connection]:
    return spdy.Connection(client=True), spdy.Connection(client=False, **server_options)


def pump(source: spdy.Connection, sink: spdy.Connection) -> list[spdy.Event]:
    return sink.receive_data(source.data_to_send())


def test_the_dictionary_is_the_specs():
    assert len(DICTIONARY) == 1423
    assert zlib.adler32(DICTIONARY) == ADLER32
    assert DICTIONARY.startswith(b"\x00\x00\x00\x07options\x00\x00\x00\x04head")
    assert DICTIONARY.endswith(b"utf-,*,enq=0.")


def test_frames_spdystream_wrote_decode_in_one_context():
    server = spdy.Connection(client=False)
    events = server.receive_data(GO_SYN1 + GO_SYN3 + GO_DATA3_FIN)
    assert events == [spdy.StreamOpened(1, {"streamtype": "error"}), spdy.StreamOpened(3, {"streamtype": "stdout"}),
                      spdy.DataReceived(3, b"hi"), spdy.StreamEnded(3)]


def test_a_reply_spdystream_wrote_decodes_after_its_streams():
    client = spdy.Connection(client=True)
    client.open_stream({"streamtype": "error"})
    client.data_to_send()
    decompressor = spdy.HeaderDecompressor()  # as the peer would: its context saw SYN1 and SYN3 first
    decompressor.decompress(GO_SYN1[18:])
    decompressor.decompress(GO_SYN3[18:])
    assert decompressor.decompress(GO_REPLY1[12:]) == {}


def test_our_frames_are_spdystreams_byte_for_byte_where_no_compression_is_involved():
    client, server = pair()
    server.receive_data(GO_SYN1 + GO_SYN3)
    server.reply(3)
    server.data_to_send()
    server.send_data(3, b"hi", fin=True)
    assert server.data_to_send() == GO_DATA3_FIN
    server.goaway()
    server.reset_stream(1, spdy.CANCEL)
    assert server.data_to_send() == struct.pack(">HHIII", 0x8003, 7, 8, 3, 0) + struct.pack(
        ">HHIII", 0x8003, 3, 8, 1, 5)


def test_our_header_blocks_carry_the_dictionary_id_and_round_trip_across_frames():
    compressor, decompressor = spdy.HeaderCompressor(), spdy.HeaderDecompressor()
    first = compressor.compress({"streamType": "data", "port": "8080", "requestID": "0"})
    assert first[:2] == b"\x78\xf9" and first[2:6] == ADLER32.to_bytes(4, "big")  # FDICT set
    second = compressor.compress({"streamtype": "error", "port": "8080", "requestid": "0"})
    assert not second.startswith(b"\x78")  # one context: no second zlib header
    assert decompressor.decompress(first) == {"streamtype": "data", "port": "8080", "requestid": "0"}
    assert decompressor.decompress(second) == {"streamtype": "error", "port": "8080", "requestid": "0"}


def test_go_control_frames_parse():
    client = spdy.Connection(client=True)
    stream = client.open_stream({"streamtype": "stdout"})  # 1
    client.open_stream({})  # 3
    client.data_to_send()
    events = client.receive_data(GO_WINDOW3 + GO_RST5_CANCEL + GO_GOAWAY5)
    assert events == [spdy.WindowUpdated(3, 4096), spdy.GoAwayReceived(5, 0)]  # RST of an unknown stream: dropped
    assert client.peer_flow_control and stream == 1


def test_a_pair_opens_replies_exchanges_and_closes_streams():
    client, server = pair()
    sid = client.open_stream({"streamType": "stdin"})
    client.send_data(sid, b"hello")
    events = pump(client, server)
    assert events == [spdy.StreamOpened(1, {"streamtype": "stdin"}), spdy.DataReceived(1, b"hello")]
    server.reply(1)
    server.send_data(1, b"back", fin=True)
    assert pump(server, client) == [spdy.StreamReplied(1, {}), spdy.DataReceived(1, b"back"), spdy.StreamEnded(1)]
    client.end_stream(1)
    assert pump(client, server) == [spdy.StreamEnded(1)]
    assert client.open_streams() == [] and server.open_streams() == []


def test_server_streams_are_even_and_pings_are_answered():
    client, server = pair()
    assert server.open_stream({"a": "b"}) == 2
    assert pump(server, client) == [spdy.StreamOpened(2, {"a": "b"})]
    ping = client.ping()
    assert pump(client, server) == []  # answered by the core itself
    assert pump(server, client) == [spdy.PingAcknowledged(ping)]


def test_unidirectional_and_fin_on_open():
    client, server = pair()
    client.open_stream({"x": "1"}, fin=True)
    assert pump(client, server) == [spdy.StreamOpened(1, {"x": "1"}, fin=True)]
    server.reply(1, fin=True)
    assert pump(server, client) == [spdy.StreamReplied(1, {}, fin=True), spdy.StreamEnded(1)]
    assert client.open_streams() == [] and server.open_streams() == []


def test_a_peer_without_flow_control_is_not_held_to_windows():
    client, server = pair()
    client.open_stream({})
    pump(client, server)
    server.reply(1)
    big = bytes(300_000)
    assert server.send_window(1) is None
    assert server.send_data(1, big) == len(big)
    received = b"".join(e.data for e in pump(server, client) if isinstance(e, spdy.DataReceived))
    assert received == big


def test_a_peer_that_updates_windows_is_held_to_them_and_released_by_window_updates():
    client, server = pair()
    client.open_stream({})
    pump(client, server)
    server.reply(1)
    pump(server, client)
    client.acknowledge_received(1, 1)  # not half a window: nothing sent yet
    assert client.data_to_send() == b""
    client.send_settings({spdy.SETTINGS_INITIAL_WINDOW_SIZE: spdy.DEFAULT_WINDOW})
    assert pump(client, server) == [spdy.SettingsReceived({spdy.SETTINGS_INITIAL_WINDOW_SIZE: 65536})]
    data = bytes(range(256)) * 1024  # 256 KiB
    taken = server.send_data(1, data)
    assert taken == spdy.DEFAULT_WINDOW and server.send_window(1) == 0
    received = b""
    while taken < len(data):
        chunk = b"".join(e.data for e in pump(server, client) if isinstance(e, spdy.DataReceived))
        received += chunk
        client.acknowledge_received(1, len(chunk))
        updates = pump(client, server)
        assert {type(e) for e in updates} == {spdy.WindowUpdated}
        taken += server.send_data(1, data[taken:])
    received += b"".join(e.data for e in pump(server, client) if isinstance(e, spdy.DataReceived))
    assert received == data


def test_strict_flow_control_resets_a_stream_that_overruns_its_window():
    client, server = pair(strict_flow_control=True)
    client.open_stream({})
    client.send_data(1, bytes(spdy.DEFAULT_WINDOW + 1))
    events = pump(client, server)
    assert events[-1] == spdy.StreamReset(1, spdy.FLOW_CONTROL_ERROR, local=True)


def test_lenient_receiver_takes_spdystreams_overrun():
    client, server = pair()
    client.open_stream({})
    client.send_data(1, bytes(3 * spdy.DEFAULT_WINDOW))
    assert sum(len(e.data) for e in pump(client, server) if isinstance(e, spdy.DataReceived)) == 3 * 65536


def test_acknowledged_data_opens_the_window_with_window_updates():
    client, server = pair()
    client.open_stream({})
    client.send_data(1, bytes(40_000))
    pump(client, server)
    server.acknowledge_received(1, 40_000)
    events = pump(server, client)
    assert events == [spdy.WindowUpdated(0, 40_000), spdy.WindowUpdated(1, 40_000)]


def test_partial_frames_wait_for_the_rest():
    client, server = pair()
    client.open_stream({"streamtype": "data"})
    client.send_data(1, b"abcdef")
    wire = client.data_to_send()
    events = []
    for byte in wire:
        events += server.receive_data(bytes([byte]))
    assert events == [spdy.StreamOpened(1, {"streamtype": "data"}), spdy.DataReceived(1, b"abcdef")]


def test_a_garbled_header_block_fails_the_connection_with_goaway():
    server = spdy.Connection(client=False)
    bad = GO_SYN1[:20] + b"\x00" * (len(GO_SYN1) - 20)
    events = server.receive_data(bad)
    assert isinstance(events[-1], spdy.ConnectionFailed)
    assert server.data_to_send() == struct.pack(">HHIII", 0x8003, 7, 8, 0, spdy.GOAWAY_PROTOCOL_ERROR)
    assert server.receive_data(GO_SYN3) == []  # later input is ignored


def test_a_reused_or_wrong_parity_stream_id_fails_the_connection():
    client, server = pair()
    client.open_stream({})
    wire = client.data_to_send()
    server.receive_data(wire)
    fresh = spdy.Connection(client=False)
    assert isinstance(fresh.receive_data(wire)[-1], spdy.StreamOpened)
    assert isinstance(server.receive_data(GO_SYN1)[-1], spdy.ConnectionFailed)  # id 1 again
    other = spdy.Connection(client=True)
    assert isinstance(other.receive_data(GO_SYN1)[-1], spdy.ConnectionFailed)  # odd id towards a client


def test_wrong_version_and_oversized_control_frames_fail_the_connection():
    server = spdy.Connection(client=False)
    assert isinstance(server.receive_data(struct.pack(">HHI", 0x8002, 6, 4) + b"\0\0\0\1")[-1], spdy.ConnectionFailed)
    server = spdy.Connection(client=False)
    assert isinstance(server.receive_data(struct.pack(">HHI", 0x8003, 8, 0xFFFFFF))[-1], spdy.ConnectionFailed)


def test_a_decompression_bomb_is_refused():
    compressor = zlib.compressobj(level=9, zdict=DICTIONARY)
    block = struct.pack(">I", 1) + struct.pack(">I", 1) + b"a" + struct.pack(">I", 1 << 20) + bytes(1 << 20)
    payload = compressor.compress(block) + compressor.flush(zlib.Z_SYNC_FLUSH)
    frame = struct.pack(">HHI", 0x8003, 1, 10 + len(payload)) + struct.pack(">IIBB", 1, 0, 0, 0) + payload
    assert isinstance(spdy.Connection(client=False).receive_data(frame)[-1], spdy.ConnectionFailed)


def test_after_goaway_no_new_streams_either_way():
    client, server = pair()
    server.goaway()
    pump(server, client)
    with pytest.raises(LocalProtocolError):
        client.open_stream({})
    with pytest.raises(LocalProtocolError):
        server.open_stream({})
    server.receive_data(GO_SYN1)
    assert server.data_to_send() == struct.pack(">HHIII", 0x8003, 3, 8, 1, spdy.REFUSED_STREAM)


def test_sending_on_a_closed_stream_is_a_local_error():
    client, server = pair()
    client.open_stream({}, fin=True)
    with pytest.raises(LocalProtocolError):
        client.send_data(1, b"x")
    pump(client, server)
    with pytest.raises(LocalProtocolError):
        server.send_data(1, b"x")  # not replied yet


def test_data_after_fin_resets_the_stream():
    client, server = pair()
    client.open_stream({})
    client.send_data(1, b"", fin=True)
    pump(client, server)
    frame = struct.pack(">II", 1, 1) + b"x"
    assert server.receive_data(frame) == [spdy.StreamReset(1, spdy.STREAM_ALREADY_CLOSED, local=True)]
    assert server.data_to_send() == struct.pack(">HHIII", 0x8003, 3, 8, 1, spdy.STREAM_ALREADY_CLOSED)
    assert server.open_streams() == []


def test_the_core_imports_no_io():
    for name in ("spdy.py", "spdy_dictionary.py", "channels.py"):
        path = Path(spdy.__file__).with_name(name)
        if not path.exists():
            continue
        tree = ast.parse(path.read_text())
        names = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for alias in node.names}
        names |= {(node.module or "").split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not names & {"asyncio", "socket", "time"}, name
