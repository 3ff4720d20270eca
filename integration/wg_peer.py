"""Our user-space WireGuard engine as a standalone peer process, for interop tests and the benchmark.

Run inside a network namespace: ``python -m integration.wg_peer ADDRESS`` (ADDRESS: our
tunnel IPv4 address, e.g. 10.99.0.2). It runs :class:`UserspaceEngine` with the
:mod:`integration.miniip` layer: it answers ICMP echo to ADDRESS, echoes UDP sent to port
7 back to the sender, and records every UDP datagram it receives.

Line protocol on stdin/stdout (one JSON object per line, one reply per request):

    {"op": "apply", "config": {private_key (base64), listen_port, address, peers: [...]}}
    {"op": "initiate", "peer": "<base64 public key>"}          start a handshake now
    {"op": "expire", "peer": "<base64>"}                        force the sessions to expire (rekey)
    {"op": "under_load", "value": true}                         answer handshakes without mac2 with cookie replies
    {"op": "send_udp", "dst": ip, "sport": n, "dport": n, "data": "<hex>"}
    {"op": "status"} -> {"status": EngineStatus, "events": {...}, "drops": {...}, "udp": [[src, sport, dport, hex], ...]}
    {"op": "stop"}

EOF on stdin stops the engine. Test-only: the private key crosses a pipe.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys

from anex_agent.wire.keys import decode_key
from anex_agent.tunnels.engines.config import DesiredConfig, PeerConfig
from anex_agent.tunnels.engines.userspace import UserspaceEngine
from integration import miniip

ECHO_PORT = 7


def desired_from(doc: dict) -> DesiredConfig:
    """The ``config`` of an ``apply`` line as a DesiredConfig (also used by engine_driver.py)."""
    return DesiredConfig(
        private_key=base64.b64decode(doc["private_key"]),
        listen_port=doc.get("listen_port"),
        address=doc["address"],
        mtu=doc.get("mtu", 1420),
        peers=tuple(
            PeerConfig(public_key=p["public_key"], endpoint=p.get("endpoint"), allowed_ips=tuple(p["allowed_ips"]),
                       persistent_keepalive=p.get("persistent_keepalive", 0), preshared_key=p.get("preshared_key"))
            for p in doc.get("peers", ())
        ),
        routes=tuple(doc.get("routes", ())),
    )


async def main(address: str) -> int:
    async with asyncio.TaskGroup() as tg:  # the engine's tasks are owned by this "role"
        return await drive(address, tg)


async def drive(address: str, tg: asyncio.TaskGroup) -> int:
    from anex_agent.tasks import Tasks

    received: list[list] = []
    engine: UserspaceEngine

    def on_packet(packet: bytes, peer: bytes) -> None:
        reply, udp = miniip.handle(packet, address)
        if udp is not None:
            received.append([udp.src, udp.sport, udp.dport, udp.payload.hex()])
            if udp.dport == ECHO_PORT:
                reply = miniip.udp_packet(address, udp.src, ECHO_PORT, udp.sport, udp.payload)
        if reply is not None:
            engine.tunnel.send_packet(reply)

    engine = UserspaceEngine(ifname=None, on_packet=on_packet)
    await engine.start(Tasks(tg, role="wg peer"))
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    def reply(doc: dict) -> None:
        sys.stdout.write(json.dumps(doc) + "\n")
        sys.stdout.flush()

    try:
        while line := await reader.readline():
            cmd = json.loads(line)
            op = cmd["op"]
            try:
                if op == "apply":
                    await engine.apply(desired_from(cmd["config"]))
                    reply({"ok": True, "port": (await engine.status()).listen_port})
                elif op == "initiate":
                    key = decode_key(cmd["peer"])
                    engine.tunnel.call(lambda now: engine.tunnel.device.initiate_handshake(key, now))
                    reply({"ok": True})
                elif op == "under_load":
                    engine.tunnel.device.force_under_load = cmd.get("value", True)
                    reply({"ok": True})
                elif op == "expire":
                    engine.tunnel.device.expire_sessions(decode_key(cmd["peer"]))
                    reply({"ok": True})
                elif op == "send_udp":
                    engine.tunnel.send_packet(miniip.udp_packet(address, cmd["dst"], cmd["sport"], cmd["dport"],
                                                                bytes.fromhex(cmd["data"])))
                    reply({"ok": True})
                elif op == "status":
                    t = engine.tunnel
                    reply({"ok": True, "status": (await engine.status()).to_dict(),
                           "events": dict(t.events) if t else {}, "drops": dict(t.drop_reasons) if t else {},
                           "udp": received})
                elif op == "stop":
                    break
                else:
                    reply({"ok": False, "error": f"unknown op {op!r}"})
            except Exception as err:  # report to the test, keep serving
                reply({"ok": False, "error": f"{type(err).__name__}: {err}"})
    finally:
        await engine.stop()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1])))
