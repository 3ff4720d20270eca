"""The gateway's nftables rules, in a table of its own (``table inet anex_gw_<suffix>``).

The mesh reaches what the admin routed and nothing more: not other nodes, not the
gateway host's own services. What the rules do (and nothing else; all other traffic is
left to the host's own rules):

* forward, mesh to mesh: dropped first, whatever the routes say (nodes do not reach
  each other through the hub, even when a ``--route`` network covers the mesh network,
  nor through a Service: the forward hook sees the destination after kube-proxy's DNAT);
* forward, from the mesh interface: accept mesh -> ``--route`` networks; drop
  everything else entering from the mesh (the gateway is not an exit node);
* forward, to the mesh interface: accept ``--route`` networks -> mesh (the cluster
  reaches workloads' ports at their mesh addresses) and replies (ct established,related);
  drop everything else heading into the mesh;
* postrouting (nat): masquerade mesh -> ``--route`` networks when leaving through any
  interface but the mesh one, so the cluster needs no route back to the mesh for
  connections nodes open;
* input, from the mesh interface: the gateway host answers only its DNS forwarder
  (UDP and TCP 53 on the mesh address, when DNS is served), ICMP echo requests to the
  mesh address, and replies to connections it opened (ct established,related); every
  other packet for the host (sshd, a kubelet, anything bound to 0.0.0.0, the host's
  other addresses) is dropped. The WireGuard port itself is on the underlay
  interface and untouched;
* input, from anywhere else: the DNS port on the mesh address is dropped unless it
  arrives on the mesh interface or loopback.

Base chains use ``policy accept`` so that installing the table never breaks unrelated
traffic of the host; a ``drop`` verdict in any base chain is final, so the host's other
tables cannot re-open what ours drops. The ruleset is rendered as text
(:func:`render_ruleset`, pure) and loaded atomically with ``nft -f -``; removing the
table removes every rule of ours. Table and chain semantics: nft(8), "TABLES",
"CHAINS" (hook priorities ``filter`` = 0, ``srcnat`` = 100), "VERDICT STATEMENT".
"""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from anex_agent.errors import EngineError
from anex_agent.gateway.settings import DNS_PORT

TABLE_PREFIX = "anex_gw_"


@dataclass(frozen=True)
class GatewayRules:
    """Inputs of the ruleset. ``mesh_address`` is the gateway's own mesh IP (the DNS server)."""

    table: str
    mesh_ifname: str
    mesh_network: str
    mesh_address: str
    routes: tuple[str, ...]
    dns: bool = True


def _family_kw(network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> str:
    return "ip" if network.version == 4 else "ip6"


def _set(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else "{ " + ", ".join(items) + " }"


def _quote(name: str) -> str:
    if not name.replace("_", "").replace("-", "").replace(".", "").isalnum():
        raise EngineError(f"interface name {name!r} cannot be used in an nftables rule")
    return f'"{name}"'


def render_ruleset(rules: GatewayRules) -> str:
    """The ``nft -f`` script that (re)creates our table. Pure.

    The script first creates then deletes the table (so a stale one from a crash goes
    away) and defines it again, all in one atomic transaction.
    """
    mesh = ipaddress.ip_network(rules.mesh_network, strict=False)
    fam = _family_kw(mesh)
    wg = _quote(rules.mesh_ifname)
    routes = [ipaddress.ip_network(r, strict=False) for r in rules.routes]
    same_family = [str(r) for r in routes if r.version == mesh.version]
    lines = [
        f"table inet {rules.table}",
        f"delete table inet {rules.table}",
        f"table inet {rules.table} {{",
        "\tchain forward {",
        "\t\ttype filter hook forward priority filter; policy accept;",
        f"\t\tiifname {wg} oifname {wg} drop",
    ]
    if same_family:
        lines.append(f"\t\tiifname {wg} {fam} saddr {mesh} {fam} daddr {_set(same_family)} accept")
        lines.append(f"\t\toifname {wg} {fam} saddr {_set(same_family)} {fam} daddr {mesh} accept")
    lines += [
        f"\t\toifname {wg} ct state established,related accept",
        f"\t\tiifname {wg} drop",
        f"\t\toifname {wg} drop",
        "\t}",
        "\tchain postrouting {",
        "\t\ttype nat hook postrouting priority srcnat; policy accept;",
    ]
    if same_family:
        lines.append(f"\t\toifname != {wg} {fam} saddr {mesh} {fam} daddr {_set(same_family)} masquerade")
    lines.append("\t}")
    lines += _input_chain(rules, wg)
    lines.append("}")
    return "\n".join(lines) + "\n"


def _input_chain(rules: GatewayRules, wg: str) -> list[str]:
    """What the mesh may reach on the gateway host itself: DNS, echo, replies; nothing else."""
    addr = ipaddress.ip_address(rules.mesh_address)
    afam = "ip" if addr.version == 4 else "ip6"
    echo = "icmp type echo-request" if addr.version == 4 else "icmpv6 type echo-request"
    lines = [
        "\tchain input {",
        "\t\ttype filter hook input priority filter; policy accept;",
        f"\t\tiifname {wg} ct state established,related accept",
    ]
    if rules.dns:
        lines.append(f"\t\tiifname {wg} {afam} daddr {addr} meta l4proto {{ tcp, udp }} th dport {DNS_PORT} accept")
    lines += [
        f"\t\tiifname {wg} {afam} daddr {addr} {echo} accept",
        f"\t\tiifname {wg} drop",
    ]
    if rules.dns:
        lines.append(
            f"\t\t{afam} daddr {addr} meta l4proto {{ tcp, udp }} th dport {DNS_PORT} "
            f'iifname != {{ {wg}, "lo" }} drop'
        )
    lines.append("\t}")
    return lines


def _nft(args: list[str], script: str | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["nft", *args], input=script, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise EngineError("nft not found on PATH (install the nftables package)") from None
    except subprocess.TimeoutExpired:
        raise EngineError("nft did not answer within 30 s") from None


def install(rules: GatewayRules) -> None:
    """Load (or reload) our table atomically. EngineError with nft's message on failure."""
    result = _nft(["-f", "-"], render_ruleset(rules))
    if result.returncode != 0:
        raise EngineError(f"nft refused the gateway rules: {result.stderr.strip()}")


def remove(table: str) -> bool:
    """Delete our table if it exists; True when it was there."""
    result = _nft(["delete", "table", "inet", table])
    if result.returncode == 0:
        return True
    if "No such file or directory" in result.stderr:
        return False
    raise EngineError(f"nft could not delete table inet {table}: {result.stderr.strip()}")
