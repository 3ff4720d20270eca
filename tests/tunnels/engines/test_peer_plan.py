"""The peer diff engines apply by: add, update, remove by public key; unchanged peers keep their session."""

from __future__ import annotations

from anex_agent.tunnels.engines.config import PeerConfig
from anex_agent.tunnels.engines.peer_plan import plan_peers

KA, KB, KC = ("A" * 43 + "=", "B" * 43 + "=", "C" * 43 + "=")


def peer(key, ips=("10.254.0.2/32",), endpoint=None, keepalive=0, psk=None):
    return PeerConfig(public_key=key, endpoint=endpoint, allowed_ips=tuple(ips), persistent_keepalive=keepalive,
                      preshared_key=psk)


def test_same_peers_plan_nothing():
    peers = (peer(KA), peer(KB, endpoint="192.0.2.1:51820", keepalive=25))
    assert plan_peers(peers, peers).empty


def test_allowed_ips_compared_as_normalised_sets():
    assert plan_peers((peer(KA, ("10.0.0.0/24", "10.1.0.0/16")),), (peer(KA, ("10.1.0.5/16", "10.0.0.0/24")),)).empty


def test_add_update_remove():
    current = (peer(KA), peer(KB), peer(KC, keepalive=25))
    desired = (peer(KA, ips=("10.254.0.9/32",)), peer(KC, keepalive=25), peer("D" * 43 + "="))
    plan = plan_peers(current, desired)
    assert [p.public_key for p in plan.add] == ["D" * 43 + "="]
    assert [p.public_key for p in plan.update] == [KA]
    assert plan.remove == (KB,)


def test_roamed_endpoint_is_kept_when_desired_has_none():
    # the hub learns node endpoints; a desired peer without endpoint must not reset it
    assert plan_peers((peer(KA, endpoint="198.51.100.7:40000"),), (peer(KA),)).empty
    assert plan_peers((peer(KA, endpoint="198.51.100.7:40000"),), (peer(KA, endpoint="192.0.2.1:1"),)).update


def test_keepalive_and_psk_changes_are_updates():
    assert plan_peers((peer(KA),), (peer(KA, keepalive=25),)).update
    assert plan_peers((peer(KA, psk=KB),), (peer(KA),)).update
