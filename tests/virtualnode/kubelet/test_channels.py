"""The remote-command protocol pieces: negotiation, options, the exit Status, resize messages."""

from __future__ import annotations

import json

import pytest

from anex_agent.errors import RemoteProtocolError
from anex_agent.virtualnode.kubelet.streams import channels


def test_negotiation_takes_the_clients_first_supported_protocol():
    offer = ["v5.channel.k8s.io, v4.channel.k8s.io", "v3.channel.k8s.io,v2.channel.k8s.io", "channel.k8s.io"]
    assert channels.negotiate(offer, channels.EXEC_PROTOCOLS) == "v5.channel.k8s.io"
    assert channels.negotiate(["v4.channel.k8s.io, v5.channel.k8s.io"], channels.EXEC_PROTOCOLS) == "v4.channel.k8s.io"
    assert channels.negotiate(["v3.channel.k8s.io", "channel.k8s.io"], channels.EXEC_PROTOCOLS) is None
    assert channels.negotiate(["portforward.k8s.io"], [channels.PORT_FORWARD]) == "portforward.k8s.io"


def test_exec_options_as_the_api_server_sends_them():
    query = [("command", "sh"), ("command", "-c"), ("command", "exit 7"), ("input", "1"), ("output", "1"),
             ("error", "1"), ("tty", "1")]
    options = channels.exec_options(query, needs_command=True)
    assert options.command == ("sh", "-c", "exit 7")
    assert (options.stdin, options.stdout, options.stderr, options.tty) == (True, True, False, True)
    assert options.stream_types(channels.V5) == {"error", "stdin", "stdout", "resize"}
    plain = channels.exec_options({"command": "ls", "output": "true", "error": "true"}, needs_command=True)
    assert plain.stream_types(channels.V4) == {"error", "stdout", "stderr"}


def test_exec_options_refuse_nonsense():
    with pytest.raises(ValueError, match="command"):
        channels.exec_options({"output": "1"}, needs_command=True)
    with pytest.raises(ValueError, match="at least 1 of stdin, stdout, stderr"):
        channels.exec_options({"command": "ls"}, needs_command=True)
    assert channels.exec_options({"output": "1"}, needs_command=False).command == ()
    with pytest.raises(ValueError, match="at least 1"):  # the pod API's names are not the kubelet's
        channels.exec_options({"command": "ls", "stdout": "1", "stdin": "1"}, needs_command=True)


def test_the_exit_status_is_the_kubelets_json():
    assert channels.status_json(0) == b'{"metadata":{},"status":"Success"}'
    failure = channels.status_json(7, command=["sh", "-c", "exit 7"])
    assert failure == (b'{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: '
                       b'error executing command [sh -c exit 7], exit code 7","reason":"NonZeroExitCode",'
                       b'"details":{"causes":[{"reason":"ExitCode","message":"7"}]}}')
    broken = json.loads(channels.status_json(None, message="node n-1 did not answer", reason="InternalError"))
    assert broken == {"metadata": {}, "status": "Failure", "message": "node n-1 did not answer", "reason": "InternalError"}


def test_resize_messages_split_anywhere():
    decoder = channels.ResizeDecoder()
    wire = b'{"Width":80,"Height":24}{"Width":100,"Height":40}\n{"Width":0,"Height":0}'
    sizes = []
    for index in range(0, len(wire), 7):
        sizes += decoder.feed(wire[index:index + 7])
    assert sizes == [(80, 24), (100, 40)]


def test_resize_garbage_is_a_protocol_error():
    with pytest.raises(RemoteProtocolError):
        channels.ResizeDecoder().feed(b"[1,2]")
    with pytest.raises(RemoteProtocolError):
        channels.ResizeDecoder().feed(b'{"Width":"x","Height":1}')
    with pytest.raises(RemoteProtocolError):
        channels.ResizeDecoder().feed(b"{" * (channels.MAX_RESIZE_BUFFER + 2))


def test_websocket_channels():
    assert channels.ws_frame(1, b"out") == b"\x01out"
    assert channels.ws_parse(b"\x00in") == (0, b"in")
    assert channels.ws_parse(b"\xff\x00") == (channels.CLOSE_CHANNEL, b"\x00")
    with pytest.raises(RemoteProtocolError):
        channels.ws_parse(b"")
