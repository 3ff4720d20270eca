"""Drive one engine from a test, inside a network namespace: ``ip netns exec NS python engine_driver.py ENGINE IFNAME``.

Line protocol (one JSON object per line on stdin; one JSON reply per line on stdout):

    {"op": "apply", "config": {...DesiredConfig fields, private_key as base64...}} -> {"ok": true}
    {"op": "status"}  -> {"ok": true, "status": EngineStatus.to_dict()}
    {"op": "dump"}    -> {"ok": true, "dump": {listen_port, has_private_key, peers: [...]}}
    {"op": "keepalive", "keys": [public key, ...]} -> {"ok": true, "sent": bool}   (Engine.send_keepalive)
    {"op": "stop"}    -> {"ok": true}   (then the driver exits)

Errors come back as {"ok": false, "error": "..."}. EOF on stdin stops the engine and exits,
so a test that dies still tears the engine down. Test-only: the private key crosses a pipe.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys


def _desired(doc: dict):
    from integration.wg_peer import desired_from  # one parser of the apply line for both drivers

    return desired_from(doc)


def _dump_doc(device) -> dict:
    """The UAPI/netlink view as JSON: configuration and session facts (no private key)."""
    return {
        "listen_port": device.listen_port,
        "has_private_key": device.private_key is not None,
        "peers": [
            {"public_key": base64.b64encode(p.public_key).decode(), "endpoint": p.endpoint,
             "persistent_keepalive": p.persistent_keepalive, "allowed_ips": sorted(p.allowed_ips),
             "last_handshake": p.last_handshake}
            for p in device.peers
        ],
    }


async def main(engine_name: str, ifname: str) -> int:
    async with asyncio.TaskGroup() as tg:  # the engine's tasks are owned by this "role"
        return await drive(engine_name, ifname, tg)


async def drive(engine_name: str, ifname: str, tg: asyncio.TaskGroup) -> int:
    from anex_agent.tasks import Tasks
    from anex_agent.tunnels.engines.registry import engine_classes

    engine = engine_classes()[engine_name](ifname=ifname)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    def reply(doc: dict) -> None:
        sys.stdout.write(json.dumps(doc) + "\n")
        sys.stdout.flush()

    try:
        await engine.start(Tasks(tg, role="engine driver"))
        reply({"ok": True, "started": True})
        while line := await reader.readline():
            cmd = json.loads(line)
            try:
                if cmd["op"] == "apply":
                    await engine.apply(_desired(cmd["config"]))
                    reply({"ok": True})
                elif cmd["op"] == "status":
                    reply({"ok": True, "status": (await engine.status()).to_dict()})
                elif cmd["op"] == "dump":
                    reply({"ok": True, "dump": _dump_doc(await engine.dump())})
                elif cmd["op"] == "keepalive":
                    reply({"ok": True, "sent": await engine.send_keepalive(cmd["keys"])})
                elif cmd["op"] == "stop":
                    break
                else:
                    reply({"ok": False, "error": f"unknown op {cmd['op']!r}"})
            except Exception as err:  # report to the test, keep serving
                reply({"ok": False, "error": f"{type(err).__name__}: {err}"})
    finally:
        await engine.stop()
        reply({"ok": True, "stopped": True})
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2])))
