"""``ANEX_TEST_NODE_KEY=<base64 private> python relay_node.py URL GATEWAY_PUBLIC_KEY``: a node's
connections to a relay, with the agent's own client (:func:`anex_agent.tunnels.binds.relay_client.check_relay`).

For each line ``connect`` on stdin: connect, authenticate, close; print one JSON line
``{"ok": bool, "seconds": float, "how": str}``. Test helper.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from anex_agent.wire import keys
from anex_agent.tunnels.binds.relay_client import RelayTarget, check_relay


async def main(url: str, gateway_public: str) -> None:
    private = keys.decode_key(os.environ["ANEX_TEST_NODE_KEY"])
    public = keys.encode_key(keys.public_key(private))
    target = RelayTarget(url=url, gateway_public_key=keys.decode_key(gateway_public))
    loop = asyncio.get_running_loop()
    while (line := await loop.run_in_executor(None, sys.stdin.readline)).strip() == "connect":
        started = time.monotonic()
        ok, how = await check_relay(target, private_key=private, public_key=public, timeout=15)
        print(json.dumps({"ok": ok, "seconds": round(time.monotonic() - started, 4), "how": how}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
