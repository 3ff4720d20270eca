"""exec, attach and port-forward on the kubelet port, over SPDY as kubectl's spdystream speaks it,
bridged to a stand-in node that runs commands and dials ports on this machine."""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from anex_agent.virtualnode.kubelet import streams as streams_mod
from anex_agent.virtualnode.kubelet.streams import portforward
from tests.virtualnode.kubelet import fakes
from tests.virtualnode.kubelet.local_node import LocalNode
from tests.virtualnode.kubelet.spdy_client import Client, connect

EXEC_PROTOCOLS = "v5.channel.k8s.io, v4.channel.k8s.io, v3.channel.k8s.io, v2.channel.k8s.io, channel.k8s.io"


@pytest.fixture
async def kubelet():
    coordinator = fakes.FakeCoordinator()
    coordinator.views = [fakes.view("u1"), fakes.view("u2", state=fakes.ProvisionState.booting)]
    pods = [fakes.pod("train", "u1"), fakes.pod("waiting", "u2")]
    node = LocalNode()
    app = web.Application()
    streams_mod.add_routes(app, fakes.context(coordinator, pods), connect=node.connect)
    server = TestServer(app)
    await server.start_server()
    yield server, node, coordinator
    await server.close()


async def start_exec(server, command, **flags):
    from urllib.parse import quote

    path = "/exec/ml/train/training?" + "&".join([f"command={quote(c)}" for c in command] +
                                                 [f"{k}={v}" for k, v in flags.items()])
    status, headers, body, client = await connect(server.host, server.port, path, EXEC_PROTOCOLS)
    assert status == 101, body
    assert headers["x-stream-protocol-version"] == "v5.channel.k8s.io"
    assert headers["upgrade"] == "SPDY/3.1"
    return client


async def test_exec_exit_status_7_is_the_kubelets_failure_status(kubelet):
    server, node, _ = kubelet
    client = await start_exec(server, ["sh", "-c", "echo out; echo err >&2; exit 7"], output="1", error="1")
    error = await client.open(streamType="error")
    stdout = await client.open(streamType="stdout")
    stderr = await client.open(streamType="stderr")
    await error.ended.wait()
    await stdout.ended.wait()
    await stderr.ended.wait()
    status = json.loads(error.data)
    assert status["status"] == "Failure" and status["reason"] == "NonZeroExitCode"
    assert status["details"]["causes"] == [{"reason": "ExitCode", "message": "7"}]
    assert bytes(stdout.data) == b"out\n" and bytes(stderr.data) == b"err\n"
    await client.goaway.wait()
    await client.closed.wait()
    assert node.closed.is_set()
    assert node.connects == ["kubectl exec ml/train by unknown via anex-vastai"]
    assert node.features == [[]]  # no terminal: the certificate grants nothing beyond a session


async def test_exec_success_and_stdin_through_sha256sum(kubelet):
    server, node, _ = kubelet
    client = await start_exec(server, ["sha256sum"], input="1", output="1", error="1")
    error = await client.open(streamType="error")
    stdin = await client.open(streamType="stdin")
    stdout = await client.open(streamType="stdout")
    await client.open(streamType="stderr")
    payload = bytes(range(256)) * 4096 * 2  # 2 MiB
    for start in range(0, len(payload), 100_000):
        await client.send(stdin, payload[start:start + 100_000])
    await client.end(stdin)
    await error.ended.wait()
    await stdout.ended.wait()
    assert json.loads(error.data) == {"metadata": {}, "status": "Success"}
    assert stdout.data.split()[0].decode() == hashlib.sha256(payload).hexdigest()


async def test_exec_with_a_tty_starts_at_the_clients_size_and_follows_resizes(kubelet):
    server, node, _ = kubelet
    client = await start_exec(server, ["sh", "-c", "stty size; read line; stty size"], input="1", output="1",
                              tty="1")
    error = await client.open(streamType="error")
    stdin = await client.open(streamType="stdin")
    stdout = await client.open(streamType="stdout")
    resize = await client.open(streamType="resize")
    await client.send(resize, b'{"Width":101,"Height":33}')
    await client.wait_for(lambda: b"33 101" in stdout.data)  # the first size, before the command started
    await client.send(resize, b'{"Width":100,"Height":40}')
    await node.processes[0].resized.wait()
    assert node.processes[0].sizes == [(100, 40)]
    await client.send(stdin, b"go\n")
    await error.ended.wait()
    await stdout.ended.wait()
    assert b"40 100" in stdout.data.split(b"33 101")[1]
    assert node.features == [["pty"]]
    assert json.loads(error.data)["status"] == "Success"


async def test_a_client_that_goes_away_hangs_the_command_up(kubelet):
    server, node, _ = kubelet
    client = await start_exec(server, ["sh", "-c", "echo started; sleep 600"], output="1", error="1")
    await client.open(streamType="error")
    stdout = await client.open(streamType="stdout")
    await client.open(streamType="stderr")
    await client.wait_for(lambda: bytes(stdout.data) == b"started\n")
    await client.close()
    await node.closed.wait()
    process = node.processes[0]
    assert await asyncio.wait_for(process.proc.wait(), 30) == -1  # SIGHUP
    assert process.hung_up


async def test_a_node_that_cannot_be_reached_is_a_failure_status(kubelet):
    server, node, _ = kubelet
    node.refuse = "node node-1 at 100.64.0.7:2222: connection refused"
    client = await start_exec(server, ["true"], output="1")
    error = await client.open(streamType="error")
    stdout = await client.open(streamType="stdout")
    await error.ended.wait()
    await stdout.ended.wait()
    status = json.loads(error.data)
    assert status == {"metadata": {}, "status": "Failure", "reason": "InternalError",
                      "message": "node node-1 at 100.64.0.7:2222: connection refused"}


@pytest.mark.parametrize("path, protocols, status, text", [
    ("/exec/ml/train/training?command=ls&output=1", "v3.channel.k8s.io, channel.k8s.io", 403,
     "unable to negotiate protocol"),
    ("/exec/ml/train/training?command=ls", EXEC_PROTOCOLS, 400, "at least 1 of stdin, stdout, stderr"),
    ("/exec/ml/nope/training?command=ls&output=1", EXEC_PROTOCOLS, 404, 'pod "nope" does not exist'),
    ("/exec/ml/train/other?command=ls&output=1", EXEC_PROTOCOLS, 404, 'container "other" not found'),
    ("/exec/ml/waiting/training?command=ls&output=1", EXEC_PROTOCOLS, 503, "no running machine yet"),
    ("/attach/ml/train/training?input=1&output=1", EXEC_PROTOCOLS, 400, "stdin cannot be attached"),
    ("/portForward/ml/train", "v4.channel.k8s.io", 403, "unable to negotiate protocol"),
])
async def test_requests_are_checked_before_the_upgrade(kubelet, path, protocols, status, text):
    server, node, _ = kubelet
    answer, headers, body, client = await connect(server.host, server.port, path, protocols)
    assert client is None and answer == status
    assert text in body.decode()
    assert node.connects == []


async def test_a_plain_request_is_told_to_upgrade(kubelet):
    server, _, _ = kubelet
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(b"GET /exec/ml/train/training?command=ls&output=1 HTTP/1.1\r\nHost: k\r\nConnection: close\r\n\r\n")
    answer = await reader.read()
    writer.close()
    assert answer.startswith(b"HTTP/1.1 400") and b"Upgrade request required" in answer


async def test_attach_streams_the_workloads_new_output(kubelet):
    server, _, coordinator = kubelet
    status, _, _, client = await connect(server.host, server.port, "/attach/ml/train/training?output=1&tty=1",
                                         EXEC_PROTOCOLS)
    assert status == 101
    error = await client.open(streamType="error")
    stdout = await client.open(streamType="stdout")
    await client.open(streamType="resize")
    coordinator.log_chunks.put_nowait(b"epoch 1\n")
    await client.wait_for(lambda: bytes(stdout.data) == b"epoch 1\n")
    coordinator.log_chunks.put_nowait(None)  # the workload ended
    await error.ended.wait()
    assert json.loads(error.data)["status"] == "Success"
    assert coordinator.log_calls == [("node-1", {"follow": 1, "tail": 0})]


async def test_too_many_streams_on_one_pod_answer_429(kubelet, monkeypatch):
    server, node, _ = kubelet
    monkeypatch.setattr(streams_mod, "MAX_PER_POD", 1)
    app = web.Application()
    coordinator = fakes.FakeCoordinator()
    coordinator.views = [fakes.view("u1")]
    streams_mod.add_routes(app, fakes.context(coordinator, [fakes.pod("train", "u1")]), connect=node.connect)
    second = TestServer(app)
    await second.start_server()
    try:
        first = await start_exec(second, ["sh", "-c", "sleep 600"], output="1")
        await first.open(streamType="error")
        await first.open(streamType="stdout")
        status, _, body, _ = await connect(second.host, second.port, "/exec/ml/train/training?command=ls&output=1",
                                           EXEC_PROTOCOLS)
        assert status == 429 and b"too many streams" in body
        await first.close()
        await node.closed.wait()
        await node.processes[0].proc.wait()  # hung up
    finally:
        await second.close()


async def test_streams_hold_the_nodes_slots_shared_with_followed_logs(kubelet):
    server, node, _ = kubelet
    app = web.Application()
    coordinator = fakes.FakeCoordinator()
    coordinator.views = [fakes.view("u1")]
    context = fakes.context(coordinator, [fakes.pod("train", "u1")])
    streams_mod.add_routes(app, context, connect=node.connect)
    second = TestServer(app)
    await second.start_server()
    try:
        assert context.slots.take()  # e.g. a followed log
        context.slots.limit = 1
        status, _, body, _ = await connect(second.host, second.port, "/exec/ml/train/training?command=ls&output=1",
                                           EXEC_PROTOCOLS)
        assert status == 429
        context.slots.give()
        client = await start_exec(second, ["true"], output="1")
        assert context.slots.open == 1
        error = await client.open(streamType="error")
        await client.open(streamType="stdout")
        await error.ended.wait()
        await client.closed.wait()
        await node.closed.wait()
    finally:
        await second.close()


async def test_port_forward_pairs_streams_and_copies_both_ways(kubelet):
    server, node, _ = kubelet

    async def echo(reader, writer):
        data = await reader.read()  # until the client half-closes
        writer.write(b"got " + data)
        await writer.drain()
        writer.close()

    upstream = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = upstream.sockets[0].getsockname()[1]
    status, headers, _, client = await connect(server.host, server.port, "/portForward/ml/train",
                                               "portforward.k8s.io")
    assert status == 101 and headers["x-stream-protocol-version"] == "portforward.k8s.io"
    for request in ("0", "1"):
        error = await client.open(streamType="error", port=str(port), requestID=request)
        await client.end(error)  # as kubectl does: it never writes on the error stream
        data = await client.open(streamType="data", port=str(port), requestID=request)
        await client.send(data, f"hello {request}".encode(), fin=True)
        await data.ended.wait()
        await error.ended.wait()
        assert bytes(data.data) == f"got hello {request}".encode() and bytes(error.data) == b""
    assert len(node.connects) == 1 and node.features == [["port-forwarding"]]  # one SSH connection, one feature
    # each connection a channel whose SSH packets may be big (fewer decryptions and reads per MiB)
    assert [o.get("max_pktsize") for o in node.channel_options] == [portforward.CHANNEL_PACKET] * 2
    assert portforward.CHANNEL_PACKET > 32 * 1024  # asyncssh's default
    await client.close()
    upstream.close()
    await node.closed.wait()


async def test_a_node_side_that_fails_mid_transfer_resets_the_data_stream(kubelet):
    """The connection to the node lost halfway (the SSH connection failed): the client's data
    stream is reset, so kubectl ends that connection instead of waiting for more."""
    import socket
    import struct

    server, _, _ = kubelet

    async def send_then_reset(reader, writer):
        writer.write(b"x" * 1000)
        await writer.drain()
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # RST, as a connection that breaks

    upstream = await asyncio.start_server(send_then_reset, "127.0.0.1", 0)
    port = upstream.sockets[0].getsockname()[1]
    _, _, _, client = await connect(server.host, server.port, "/portForward/ml/train", "portforward.k8s.io")
    error = await client.open(streamType="error", port=str(port), requestID="0")
    await client.end(error)
    data = await client.open(streamType="data", port=str(port), requestID="0")  # the client sends nothing yet
    await asyncio.wait_for(data.ended.wait(), 30)
    assert data.reset
    await client.close()
    upstream.close()


async def test_port_forward_to_a_closed_port_says_so_on_the_error_stream(kubelet):
    server, _, _ = kubelet
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    _, _, _, client = await connect(server.host, server.port, "/portForward/ml/train", "portforward.k8s.io")
    error = await client.open(streamType="error", port=str(port), requestID="0")
    data = await client.open(streamType="data", port=str(port), requestID="0")
    await error.ended.wait()
    await data.ended.wait()
    assert bytes(error.data).startswith(f"error forwarding port {port} to pod train, uid u1: ".encode())
    bad = await client.open(streamType="error", port="http", requestID="1")
    await client.open(streamType="data", port="http", requestID="1")
    await bad.ended.wait()
    assert b"invalid port 'http'" in bytes(bad.data)
    await client.close()


async def test_exec_over_a_websocket_v5_with_its_close_signal(kubelet):
    from websockets.asyncio.client import connect as ws_connect

    server, node, _ = kubelet
    url = f"ws://{server.host}:{server.port}/exec/ml/train/training?command=sh&command=-c&command=cat%3B%20exit%203" \
          "&input=1&output=1&error=1"
    async with ws_connect(url, subprotocols=["v5.channel.k8s.io", "v4.channel.k8s.io"]) as ws:
        assert ws.subprotocol == "v5.channel.k8s.io"
        await ws.send(b"\x00hello ")
        await ws.send(b"\x00websocket")
        await ws.send(b"\xff\x00")  # v5: no more stdin
        received: dict[int, bytes] = {}
        async for message in ws:
            received[message[0]] = received.get(message[0], b"") + message[1:]
    assert received[1] == b"hello websocket"
    status = json.loads(received[3])
    assert status["reason"] == "NonZeroExitCode" and status["details"]["causes"][0]["message"] == "3"
    assert ws.close_code == 1000
    await node.closed.wait()


async def test_a_websocket_without_our_subprotocols_is_refused(kubelet):
    from websockets.asyncio.client import connect as ws_connect
    from websockets.exceptions import InvalidStatus

    server, node, _ = kubelet
    with pytest.raises(InvalidStatus) as refused:
        async with ws_connect(f"ws://{server.host}:{server.port}/exec/ml/train/training?command=ls&output=1",
                              subprotocols=["base64.channel.k8s.io"]):
            pass
    assert refused.value.response.status_code == 403
    assert node.connects == []


async def _bounded_server(node, **limits):
    from anex_agent.virtualnode.kubelet.context import KubeletContext, Limits

    coordinator = fakes.FakeCoordinator()
    coordinator.views = [fakes.view("u1")]
    base = fakes.context(coordinator, [fakes.pod("train", "u1")])
    context = KubeletContext(node_name=base.node_name, authorizer=base.authorizer, pods=base.pods,
                             coordinator=coordinator, limits=Limits(**limits))
    app = web.Application()
    streams_mod.add_routes(app, context, connect=node.connect)
    server = TestServer(app)
    await server.start_server()
    return server


async def test_an_idle_session_is_closed_and_its_command_hung_up():
    node = LocalNode()
    server = await _bounded_server(node, stream_idle_timeout=0.5)
    try:
        client = await start_exec(server, ["sleep", "600"], output="1")
        await client.open(streamType="error")
        await client.open(streamType="stdout")
        await asyncio.wait_for(client.closed.wait(), 60)  # nothing flows: the port closes it
        if node.processes:  # it may close before the command even started
            assert await asyncio.wait_for(node.processes[0].proc.wait(), 60) == -1
    finally:
        await server.close()


async def test_a_client_that_never_opens_its_streams_is_let_go():
    node = LocalNode()
    server = await _bounded_server(node, stream_creation_timeout=0.2)
    try:
        client = await start_exec(server, ["true"], output="1", error="1")
        await client.open(streamType="error")  # stdout and stderr never come
        await asyncio.wait_for(client.goaway.wait(), 60)
        await asyncio.wait_for(client.closed.wait(), 60)
        assert node.connects == []  # nothing was started on the machine
    finally:
        await server.close()


async def test_a_long_port_forward_session_keeps_no_finished_streams():
    from anex_agent.virtualnode.kubelet.streams.session import SpdySession

    server_side, client_side = await _socket_pair()
    session = SpdySession(*server_side, name="test")
    reader = asyncio.ensure_future(session.run())
    client = Client(*client_side)
    for _ in range(5):
        opened = await client.open(streamType="data")
        stream = await session.accept()
        await client.send(opened, b"x", fin=True)
        assert await stream.read() == b"x" and await stream.read() == b""
        await stream.close()
    assert session.streams == {}
    await session.close()
    await client.closed.wait()
    reader.cancel()


async def _socket_pair():
    ready: asyncio.Future = asyncio.get_running_loop().create_future()
    listener = await asyncio.start_server(lambda r, w: ready.set_result((r, w)), "127.0.0.1", 0)
    client = await asyncio.open_connection(*listener.sockets[0].getsockname()[:2])
    server = await ready
    listener.close()
    return server, client


async def test_streams_beyond_the_sessions_bound_are_refused(monkeypatch):
    from anex_agent.virtualnode.kubelet.streams import session as session_mod

    monkeypatch.setattr(session_mod, "MAX_STREAMS", 2)
    server_side, client_side = await _socket_pair()
    session = session_mod.SpdySession(*server_side, name="test")
    reader = asyncio.ensure_future(session.run())
    client = Client(*client_side)
    await client.open(streamType="data")
    await client.open(streamType="data")
    third = await client.open(streamType="data")  # never replied: reset
    assert third.reset and not third.replied.is_set()
    assert sorted(session.streams) == [1, 3]
    await session.close()
    await client.closed.wait()
    reader.cancel()
