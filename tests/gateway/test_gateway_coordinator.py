"""The gateway supervisor against the real coordinator app (SQLite, in-process), without privileges.

The hub is an in-memory engine that records what ``apply()`` is asked (the real engines
need root and run in integration/); registration, the watch stream, the peer book, the
saved state and fail static are all real.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import time
from pathlib import Path

import pytest

from anex_agent.client.rest import CoordinatorClient
from anex_agent.gateway.service import Gateway
from anex_agent.gateway.settings import build_settings
from anex_agent.wire.keys import KeyPair, generate_private_key
from anex_agent.tunnels.engines.base import Engine
from anex_agent.tunnels.engines.config import DesiredConfig
from anex_agent.tunnels.engines.status import EngineStatus, Support
from tests.polling import wait_until


class RecordingEngine(Engine):
    """Keeps the last DesiredConfig; stands in for the OS engines, which need root."""

    name = "recording"

    def __init__(self) -> None:
        self.applied: list[DesiredConfig] = []
        self.changed = asyncio.Event()

    @classmethod
    def is_supported(cls) -> Support:
        return Support(True, "in memory")

    async def start(self) -> None:
        pass

    async def apply(self, desired: DesiredConfig) -> None:
        self.applied.append(desired)
        self.changed.set()

    async def status(self) -> EngineStatus:
        return EngineStatus(engine=self.name, interface=None, listen_port=0, running=True)

    async def stop(self) -> None:
        pass

    def dialer(self, resolver=None):
        return None

    def peer_keys(self) -> set[str]:
        return {p.public_key for p in self.applied[-1].peers} if self.applied else set()




def make_gateway(url: str, state: Path, token: str) -> tuple[Gateway, RecordingEngine]:
    gateway = Gateway(build_settings(coordinator_url=url, token=token, state_dir=str(state),
                                     endpoint="192.0.2.1:51820", routes=["10.96.0.0/12"]))
    gateway.state.ensure()
    gateway.keypair = gateway.state.keypair()
    engine = RecordingEngine()
    gateway.engine = engine
    return gateway, engine


async def join_node(url: str, admin: CoordinatorClient, name: str) -> tuple[str, str]:
    token = (await admin.create_join_token()).token
    pair = KeyPair(generate_private_key())
    key = pair.public_b64
    async with CoordinatorClient(url) as node:
        joined = await node.join(token, pair, name, "other")
    return joined.node_id, key


async def test_registers_and_follows_the_watch_stream(coordinator, tmp_path):
    url, admin = coordinator
    token = (await admin.create_join_token("gateway", reusable=True)).token
    gateway, engine = make_gateway(url, tmp_path / "gw", token)
    try:
        assert await gateway._initial_registration() is True
        assert gateway.registration.address and gateway.book.peers == {}
        listed = (await admin.list_gateways()).gateways
        assert [g.public_key for g in listed] == [gateway.keypair.public_b64]
        assert listed[0].routes == ["10.96.0.0/12"] and listed[0].endpoint == "192.0.2.1:51820"
        await gateway._apply_peers()
        watcher = asyncio.create_task(gateway._watch_loop(), name="test-gateway-watch")
        try:
            started = time.monotonic()
            node_id, key = await join_node(url, admin, "n1")
            await wait_until(lambda: key in engine.peer_keys(), what="joined node reaches the hub")
            latency = time.monotonic() - started
            assert engine.applied[-1].peers[0].allowed_ips[0].endswith("/32")
            await admin.delete_node(node_id)
            await wait_until(lambda: key not in engine.peer_keys(), what="deleted node leaves the hub")
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        print(f"join -> hub apply: {latency:.3f} s")
        # the peer set is saved for a fail-static restart
        saved = gateway.state.load(url)
        assert saved is not None and saved[1].peers == [] and saved[1].version >= 1
    finally:
        await gateway.link.close()


async def test_restart_with_the_coordinator_down_uses_the_saved_state(coordinator, tmp_path):
    url, admin = coordinator
    token = (await admin.create_join_token("gateway", reusable=True)).token
    first, _ = make_gateway(url, tmp_path / "gw", token)
    node_id, key = await join_node(url, admin, "n1")
    assert await first._initial_registration() is True
    first.save_now()  # what the start does beside configuring the hub
    await first.link.close()
    assert key in {p.public_key for p in first.book.peer_configs()}

    # same state dir, same coordinator URL, but nothing answers there any more
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    import json

    state_file = tmp_path / "gw" / "gateway.json"
    doc = json.loads(state_file.read_text())
    doc["registration"]["coordinator_url"] = dead
    state_file.write_text(json.dumps(doc))
    second, _ = make_gateway(dead, tmp_path / "gw", token)
    try:
        assert await second._initial_registration() is False  # fail static, no waiting
        assert second.registration.address == first.registration.address
        assert key in {p.public_key for p in second.book.peer_configs()}
    finally:
        await second.link.close()


async def test_bad_token_without_saved_state_is_a_clear_error(coordinator, tmp_path):
    """One line naming where the token came from, why it was refused, and how to get one that lasts."""
    url, admin = coordinator
    from anex_agent.errors import ConfigError

    for token, why in (("not-a-token", "not valid"),
                       ((await admin.create_join_token()).token, "it is a node join token; this needs a gateway")):
        gateway, _ = make_gateway(url, tmp_path / "gw", token)
        try:
            with pytest.raises(ConfigError) as info:
                await gateway._initial_registration()
        finally:
            await gateway.link.close()
        text = str(info.value)
        assert info.value.source == "ANEX_GATEWAY_TOKEN" and why in text
        assert "anex-agent admin tokens create --kind gateway --reusable --ttl 365d" in text
        assert text.endswith("set it in ANEX_GATEWAY_TOKEN")


async def test_renews_its_credential_and_saves_it(coordinator, tmp_path):
    url, admin = coordinator
    token = (await admin.create_join_token("gateway")).token
    gateway, _ = make_gateway(url, tmp_path / "gw", token)
    try:
        assert await gateway._initial_registration() is True
        first = gateway.registration.credential
        gateway.rotate_in = 0.05
        renewer = asyncio.create_task(gateway._renew_loop(), name="test-gateway-renew")
        try:
            await wait_until(lambda: gateway.registration.credential != first, what="renewed credential")
        finally:
            renewer.cancel()
            await asyncio.gather(renewer, return_exceptions=True)
        saved = gateway.state.load(url)
        assert saved is not None and saved[0].credential == gateway.registration.credential
        assert gateway.link.client.credential == gateway.registration.credential
        await gateway.link.peers(gateway.registration.gateway_id)
        assert gateway.rotate_in == 3600.0  # the coordinator's period, from the renewal answer
    finally:
        await gateway.link.close()


async def test_a_refused_credential_without_a_token_stops_the_watch_with_an_error(coordinator, tmp_path, caplog):
    url, admin = coordinator
    token = (await admin.create_join_token("gateway")).token
    gateway, _ = make_gateway(url, tmp_path / "gw", token)
    try:
        assert await gateway._initial_registration() is True
        await admin.delete_gateway(gateway.registration.gateway_id)
        gateway.settings = dataclasses.replace(gateway.settings, token="")
        await asyncio.wait_for(gateway._watch_loop(), 10)  # returns instead of retrying forever
        assert any("no gateway token" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)
    finally:
        await gateway.link.close()


async def test_a_stop_tells_the_coordinator_the_gateway_is_gone(coordinator, tmp_path):
    url, admin = coordinator
    token = (await admin.create_join_token("gateway", reusable=True)).token
    gateway, _ = make_gateway(url, tmp_path / "gw", token)
    try:
        assert await gateway._initial_registration() is True
        await gateway._leave()
        (listed,) = (await admin.list_gateways()).gateways
        assert listed.gone_at is not None and listed.gone_reason == "stopped"
    finally:
        await gateway.link.close()


async def test_a_stop_does_not_hang_on_a_coordinator_that_does_not_answer(coordinator, tmp_path, monkeypatch, caplog):
    from anex_agent.gateway import service

    url, admin = coordinator
    token = (await admin.create_join_token("gateway", reusable=True)).token
    gateway, _ = make_gateway(url, tmp_path / "gw", token)
    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        try:
            assert await gateway._initial_registration() is True
            await gateway.link.close()
            gateway.link = type(gateway.link)(f"http://127.0.0.1:{silent.getsockname()[1]}")
            gateway.link.set_credential(gateway.registration.credential)
            monkeypatch.setattr(service, "LEAVE_TIMEOUT", 0.2)
            await asyncio.wait_for(gateway._leave(), 30)  # bounded by LEAVE_TIMEOUT, not by the client's own timeout
        finally:
            await gateway.link.close()
    assert "did not take this gateway's stop" in caplog.text
    assert (await admin.list_gateways()).gateways[0].gone_at is None
