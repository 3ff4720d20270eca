"""The gateway's state dir: key pair, saved registration and peer set (fail-static start), and the
journal that makes a change cost one line whatever the size of the set."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from anex_agent.errors import EngineError
from anex_agent.gateway.peers import PeerBook
from anex_agent.gateway.service import Gateway
from anex_agent.gateway.settings import build_settings
from anex_agent.gateway.state import JOURNAL_MIN, GatewayState, Registration
from anex_agent.wire.keys import encode_key
from anex_agent.wire.gateways import MeshPeer, PeerSet
from anex_agent.wire.watch import WatchEvent
from tests.polling import wait_until

REG = Registration(coordinator_url="http://127.0.0.1:8700", gateway_id="g1", credential="secret-credential",
                   address="10.254.0.1", network="10.254.0.0/16", mtu=1420)
PEERS = PeerSet(version=7, peers=[MeshPeer(node_id="n1", name="n1", public_key="A" * 43 + "=", allowed_ips=["10.254.0.2/32"])])


def test_saved_registration_roundtrip_is_private(tmp_path):
    state = GatewayState(tmp_path / "gw")
    state.ensure()
    state.save(REG, PEERS)
    path = tmp_path / "gw" / "gateway.json"
    assert path.stat().st_mode & 0o777 == 0o600
    loaded = state.load("http://127.0.0.1:8700")
    assert loaded == (REG, PEERS)
    assert "secret-credential" not in repr(REG)


def test_saved_state_of_another_coordinator_is_not_used(tmp_path):
    state = GatewayState(tmp_path)
    state.save(REG, PEERS)
    assert state.load("http://other:8700") is None


def test_corrupt_state_is_ignored(tmp_path):
    (tmp_path / "gateway.json").write_text("{not json")
    assert GatewayState(tmp_path).load("http://127.0.0.1:8700") is None
    (tmp_path / "gateway.json").write_text('{"registration": {"coordinator_url": "http://127.0.0.1:8700"}, "peers": {}}')
    assert GatewayState(tmp_path).load("http://127.0.0.1:8700") is None


def test_desired_config_of_the_hub(tmp_path):
    settings = build_settings(coordinator_url="http://127.0.0.1:8700", token="t", state_dir=str(tmp_path), listen_udp="0.0.0.0:51999",
                              endpoint="192.0.2.1:51999")
    gateway = Gateway(settings)
    gateway.state.ensure()
    gateway.keypair = gateway.state.keypair()
    gateway.registration = REG
    gateway.book = PeerBook.from_peer_set(PEERS)
    desired = gateway.desired()
    assert desired.address == "10.254.0.1/16" and desired.listen_port == 51999 and desired.mtu == 1420
    assert [p.allowed_ips for p in desired.peers] == [("10.254.0.2/32",)]
    assert desired.private_key == gateway.keypair.private
    assert (tmp_path / "private.key").stat().st_mode & 0o777 == 0o600


# ---------------------------------------------------------------- the journal


def mp(node_id: str, i: int) -> MeshPeer:
    return MeshPeer(node_id=node_id, name=node_id, public_key=encode_key(i.to_bytes(4, "big") * 8),
                    allowed_ips=[f"10.254.{i // 250}.{i % 250 + 2}/32"])


def added(peer: MeshPeer, version: int) -> WatchEvent:
    return WatchEvent(type="peer_added", version=version, peer=peer)


def removed(peer: MeshPeer, version: int) -> WatchEvent:
    return WatchEvent(type="peer_removed", version=version, peer=peer)


def applied(book: PeerBook, state: GatewayState, event: WatchEvent) -> None:
    """What the gateway does per event: apply it to the book, record it for the journal."""
    book.apply(event)
    state.record(event)


def journal_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "peers.journal").read_text().splitlines()]


def test_changes_are_journal_lines_replayed_on_load(tmp_path):
    state = GatewayState(tmp_path)
    a, b, c = mp("n1", 1), mp("n2", 2), mp("n3", 3)
    book = PeerBook.from_peer_set(PeerSet(version=3, peers=[a, b]))
    state.save(REG, book.to_peer_set())
    applied(book, state, added(c, 4))
    applied(book, state, removed(a, 5))
    applied(book, state, added(mp("n2", 9), 6))  # n2 re-keyed: the old key goes
    assert state.flush() == 3
    assert (tmp_path / "peers.journal").stat().st_mode & 0o777 == 0o600
    header, *lines = journal_lines(tmp_path)
    assert header == {"journal": state.journal_id} and [line["version"] for line in lines] == [4, 5, 6]

    loaded = GatewayState(tmp_path).load(REG.coordinator_url)
    assert loaded == (REG, book.to_peer_set())
    assert [p.node_id for p in loaded[1].peers] == ["n2", "n3"] and loaded[1].version == 6


def test_a_change_writes_one_line_whatever_the_size_of_the_set(tmp_path):
    state = GatewayState(tmp_path)
    book = PeerBook.from_peer_set(PeerSet(version=1, peers=[mp(f"n{i:05d}", i) for i in range(10_000)]))
    state.save(REG, book.to_peer_set())
    snapshot = (tmp_path / "gateway.json").stat()
    journal_size = (tmp_path / "peers.journal").stat().st_size
    applied(book, state, added(mp("new", 10_001), 2))
    assert state.flush() == 1
    after = (tmp_path / "gateway.json").stat()
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == (snapshot.st_ino, snapshot.st_mtime_ns,
                                                                snapshot.st_size)  # not rewritten
    assert 0 < (tmp_path / "peers.journal").stat().st_size - journal_size < 400
    assert len(GatewayState(tmp_path).load(REG.coordinator_url)[1].peers) == 10_001


def test_a_journal_the_snapshot_already_includes_is_not_replayed(tmp_path):
    """Stopped between the two renames of a rewrite: the new snapshot beside the old journal."""
    state = GatewayState(tmp_path)
    a, b = mp("n1", 1), mp("n2", 2)
    book = PeerBook.from_peer_set(PeerSet(version=1, peers=[a]))
    state.save(REG, book.to_peer_set())
    applied(book, state, removed(a, 2))
    state.flush()
    old_journal = (tmp_path / "peers.journal").read_bytes()
    applied(book, state, added(a, 3))  # a came back: the snapshot below has it, the old journal removes it
    applied(book, state, added(b, 4))
    state.save(REG, book.to_peer_set())
    (tmp_path / "peers.journal").write_bytes(old_journal)
    loaded = GatewayState(tmp_path).load(REG.coordinator_url)[1]
    assert [p.node_id for p in loaded.peers] == ["n1", "n2"] and loaded.version == 4


def test_a_torn_last_line_ends_the_replay(tmp_path, caplog):
    state = GatewayState(tmp_path)
    book = PeerBook.from_peer_set(PeerSet(version=1, peers=[]))
    state.save(REG, book.to_peer_set())
    applied(book, state, added(mp("n1", 1), 2))
    state.flush()
    with open(tmp_path / "peers.journal", "ab") as journal:  # killed while appending the next one
        journal.write(b'{"type":"peer_added","version":3,"peer":{"node_id":"n2","na')
    reader = GatewayState(tmp_path)
    loaded = reader.load(REG.coordinator_url)[1]
    assert [p.node_id for p in loaded.peers] == ["n1"] and loaded.version == 2
    assert "line 3 is incomplete" in caplog.text
    # nothing is appended after the torn line: the next write is a whole save with a new journal
    assert reader.journal_id == ""
    book = PeerBook.from_peer_set(loaded)
    applied(book, reader, added(mp("n3", 3), 4))
    assert reader.flush() == 0
    reader.save(REG, book.to_peer_set())
    applied(book, reader, added(mp("n4", 4), 5))
    assert reader.flush() == 1
    assert [p.node_id for p in GatewayState(tmp_path).load(REG.coordinator_url)[1].peers] == ["n1", "n3", "n4"]


def test_a_rewrite_keeps_later_changes_and_refuses_a_copy_older_than_the_journal(tmp_path):
    state = GatewayState(tmp_path)
    a, b, c = mp("n1", 1), mp("n2", 2), mp("n3", 3)
    book = PeerBook.from_peer_set(PeerSet(version=1, peers=[]))
    state.save(REG, book.to_peer_set())
    applied(book, state, added(a, 2))
    copy, through = book.to_peer_set(), state.recorded  # a rewrite's copy (taken on the loop) ...
    applied(book, state, added(b, 3))  # ... then a change before the rewrite runs in its thread
    assert state.save(REG, copy, through) is True
    assert state.flush() == 1  # b goes into the new journal: not lost, not written twice
    assert [line.get("version") for line in journal_lines(tmp_path)] == [None, 3]
    assert GatewayState(tmp_path).load(REG.coordinator_url)[1] == book.to_peer_set()

    copy, through = book.to_peer_set(), state.recorded
    applied(book, state, added(c, 4))
    state.flush()  # a flush went first: c is in the journal, but not in the copy
    before = (tmp_path / "gateway.json").read_bytes(), (tmp_path / "peers.journal").read_bytes()
    assert state.save(REG, copy, through) is False
    assert ((tmp_path / "gateway.json").read_bytes(), (tmp_path / "peers.journal").read_bytes()) == before
    assert GatewayState(tmp_path).load(REG.coordinator_url)[1] == book.to_peer_set()


def test_the_journal_keeps_the_order_applied_while_a_thread_writes(tmp_path):
    state = GatewayState(tmp_path)
    book = PeerBook.from_peer_set(PeerSet(version=0, peers=[]))
    state.save(REG, book.to_peer_set())
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            state.flush()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for version in range(1, 2001):  # the same node joins and leaves: any reordering shows
            peer = mp("n1", 1)
            applied(book, state, added(peer, version) if version % 2 else removed(peer, version))
    finally:
        stop.set()
        thread.join()
    state.flush()
    assert [line["version"] for line in journal_lines(tmp_path)[1:]] == list(range(1, 2001))
    loaded = GatewayState(tmp_path).load(REG.coordinator_url)[1]
    assert loaded.peers == [] and loaded.version == 2000


def test_journal_full_follows_the_size_of_the_set(tmp_path):
    state = GatewayState(tmp_path)
    book = PeerBook.from_peer_set(PeerSet(version=0, peers=[]))
    state.save(REG, book.to_peer_set())
    for version in range(1, JOURNAL_MIN + 1):
        applied(book, state, added(mp("n1", version), version))
        state.flush()
        assert state.journal_full(5) is (version >= JOURNAL_MIN)
    assert state.journal_full(JOURNAL_MIN * 3) is False  # a larger set may have a longer journal
    state.save(REG, book.to_peer_set())
    assert state.journal_lines == 0 and state.journal_full(5) is False


def test_saved_peers_follow_replacements_through_the_kept_encodings(tmp_path):
    state = GatewayState(tmp_path)
    a, b = mp("n1", 1), mp("n2", 2)
    state.save(REG, PeerSet(version=1, peers=[b, a]))
    assert state.load(REG.coordinator_url)[1] == PeerSet(version=1, peers=[a, b])
    rekeyed = mp("n2", 3)  # same node, new key: the kept encoding must not be reused
    state.save(REG, PeerSet(version=2, peers=[a, rekeyed]))
    loaded_registration, peers = state.load(REG.coordinator_url)
    assert peers == PeerSet(version=2, peers=[a, rekeyed]) and loaded_registration.gateway_id == "g1"


# ---------------------------------------------------------------- the gateway's writes


class CountingEngine:
    """The one engine call :meth:`Gateway._apply_delta` makes (``fail``: it raises, as a broken device would)."""

    def __init__(self) -> None:
        self.updates = 0
        self.fail = False

    async def update_peers(self, upsert, remove) -> bool:
        self.updates += 1
        if self.fail:
            raise EngineError("the device is gone")
        return True


async def test_changes_are_journaled_once_per_interval_off_the_event_path(tmp_path, monkeypatch):
    from anex_agent.gateway import service

    # long enough that five in-memory applies in a row always fit in it, even on a busy machine
    monkeypatch.setattr(service, "SAVE_INTERVAL", 2.0)
    gateway = Gateway(build_settings(coordinator_url=REG.coordinator_url, token="t", state_dir=str(tmp_path),
                                     endpoint="192.0.2.1:51820"))
    gateway.registration = REG
    gateway.engine = engine = CountingEngine()
    gateway.save_now()
    snapshot = (tmp_path / "gateway.json").stat().st_mtime_ns
    saver = asyncio.create_task(gateway._save_loop(), name="test-gateway-state")
    try:
        for i in range(5):  # five events in a row: nothing written yet, then one write of five lines
            event = added(mp(f"n{i}", i + 1), i + 1)
            await gateway._apply_delta(gateway._take(event))
        assert engine.updates == 5 and len(journal_lines(tmp_path)) == 1
        await wait_until(lambda: len(journal_lines(tmp_path)) >= 6, what="the journal write of five lines")
        assert [line["peer"]["node_id"] for line in journal_lines(tmp_path)[1:]] == ["n0", "n1", "n2", "n3", "n4"]
        await wait_until(lambda: not gateway._unsaved.is_set(), what="the saver idle")
        assert len(journal_lines(tmp_path)) == 6  # nothing changed since: nothing pending, nothing more written
        engine.fail = True  # the engine refuses the next change: the journal still follows the book
        event = removed(mp("n0", 1), 9)
        with pytest.raises(EngineError):
            await gateway._apply_delta(gateway._take(event))
    finally:
        saver.cancel()
        await asyncio.gather(saver, return_exceptions=True)
    assert (tmp_path / "gateway.json").stat().st_mtime_ns == snapshot  # the whole set never rewritten
    loaded = GatewayState(tmp_path).load(REG.coordinator_url)[1]  # the pending change written on the way out
    assert [p.node_id for p in loaded.peers] == ["n1", "n2", "n3", "n4"] and loaded.version == 9


async def test_the_whole_set_is_rewritten_when_the_journal_outgrew_it(tmp_path, monkeypatch):
    from anex_agent.gateway import service, state

    monkeypatch.setattr(service, "SAVE_INTERVAL", 0.05)
    monkeypatch.setattr(state, "JOURNAL_MIN", 3)
    gateway = Gateway(build_settings(coordinator_url=REG.coordinator_url, token="t", state_dir=str(tmp_path),
                                     endpoint="192.0.2.1:51820"))
    gateway.registration = REG
    gateway.engine = CountingEngine()
    gateway.save_now()
    saver = asyncio.create_task(gateway._save_loop(), name="test-gateway-state")
    try:
        for i in range(4):  # one node, re-keyed: the set stays one peer, the journal grows
            event = added(mp("n1", i + 1), i + 1)
            await gateway._apply_delta(gateway._take(event))
            await wait_until(lambda: gateway.state.journal_lines == [1, 2, 3, 0][i], what=f"write {i + 1}")
        # three lines filled the journal (max(JOURNAL_MIN, 1 peer)): the fourth change came
        # with a rewrite of the whole set and a fresh journal
        assert len(journal_lines(tmp_path)) == 1
        saved = json.loads((tmp_path / "gateway.json").read_text())
        assert saved["peers"]["peers"] == [mp("n1", 4).model_dump(mode="json")] and saved["peers"]["version"] == 4
        assert saved["journal"] == gateway.state.journal_id
    finally:
        saver.cancel()
        await asyncio.gather(saver, return_exceptions=True)
