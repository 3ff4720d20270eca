"""Interface addresses, MTU, state and routes over rtnetlink, for real, on a TUN device in a network namespace."""

from __future__ import annotations

import json
import sys

import pytest

from integration.netns import Netns, missing_prerequisites

REASON = missing_prerequisites()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

SCRIPT = r"""
import json, sys
from anex_agent.tunnels.os import netconf
from anex_agent.errors import EngineError
out = {}
out["first"] = {k: [list(v.add), list(v.remove)] for k, v in netconf.configure("anex9", "10.9.0.2/24", 1380,
                ["10.8.0.0/16", "fd01::/64", "0.0.0.0/0"]).items()}
out["again"] = netconf.changed(netconf.configure("anex9", "10.9.0.2/24", 1380, ["10.8.0.0/16", "fd01::/64", "0.0.0.0/0"]))
out["routes"] = sorted(netconf.current_routes("anex9"))
out["tun_links"] = netconf.list_links("anex", kind="tun")
out["wg_links"] = netconf.list_links("anex", kind="wireguard")
out["narrowed"] = {k: [list(v.add), list(v.remove)] for k, v in netconf.configure("anex9", "10.9.0.2/24", 1380,
                   ["10.8.0.0/16"]).items()}
try:
    netconf.configure("anex8", "10.0.0.1/24", 1380, [])
except EngineError as err:
    out["missing"] = str(err)
print(json.dumps(out))
"""


def test_configure_is_declarative_and_touches_only_our_routes():
    with Netns("nc") as ns:
        ns.run(["ip", "tuntap", "add", "anex9", "mode", "tun"])
        ns.run(["ip", "link", "add", "other0", "type", "dummy"], check=False)
        ns.run(["ip", "tuntap", "add", "keep0", "mode", "tun"])
        ns.run(["ip", "link", "set", "keep0", "up"])
        ns.run(["ip", "route", "add", "10.77.0.0/16", "dev", "keep0"])  # not ours (proto boot)
        out = json.loads(ns.check_output([sys.executable, "-c", SCRIPT]))
        assert out["first"] == {"addresses": [["10.9.0.2/24"], []],
                                "routes": [["10.8.0.0/16", "fd01::/64", "0.0.0.0/0"], []],
                                "link": [["mtu", "up"], []]}
        assert out["again"] is False
        assert out["routes"] == ["0.0.0.0/0", "10.8.0.0/16", "fd01::/64"]
        assert out["tun_links"] == ["anex9"] and out["wg_links"] == []
        assert out["narrowed"]["routes"] == [[], ["0.0.0.0/0", "fd01::/64"]]
        assert out["missing"] == "interface anex8 does not exist"
        shown = json.loads(ns.check_output(["ip", "-j", "-d", "route", "show", "proto", "97"]))
        assert [(r["dst"], r["dev"], r["scope"]) for r in shown] == [("10.8.0.0/16", "anex9", "global")]
        link = json.loads(ns.check_output(["ip", "-j", "addr", "show", "anex9"]))[0]
        assert link["mtu"] == 1380 and "UP" in link["flags"]
        assert [(a["local"], a["prefixlen"]) for a in link["addr_info"] if a["family"] == "inet"] == [("10.9.0.2", 24)]
        assert "10.77.0.0/16" in ns.check_output(["ip", "route", "show", "dev", "keep0"])
        deleted = ns.check_output([sys.executable, "-c",
                                   "from anex_agent.tunnels.os import netconf; print(netconf.delete_link('anex9'), netconf.delete_link('anex9'))"])
        assert deleted.split() == ["True", "False"]
