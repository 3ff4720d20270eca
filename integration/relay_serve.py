"""``ANEX_TEST_GATEWAY_KEY=<base64 private> python relay_serve.py PORT NODE_PUBLIC_KEY``: the gateway's
relay (:class:`anex_agent.gateway.relay.Relay`, default limits) alone, for one node key.

The hub is a UDP socket that only reads. Prints ``ready``; when stdin closes, prints the
relay's report (JSON) and exits. Test helper.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import socket
import sys

from anex_agent.wire import keys
from anex_agent.gateway.relay import Relay


async def main(port: int, node_public: str) -> None:
    hub = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    hub.bind(("127.0.0.1", 0))
    relay = Relay(host="0.0.0.0", port=port, hub=hub.getsockname(),
                  private_key=keys.decode_key(os.environ["ANEX_TEST_GATEWAY_KEY"]), is_peer=lambda pub: pub == node_public)
    await relay.start()
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)
    print(json.dumps(relay.report()), flush=True)
    await relay.close()


if __name__ == "__main__":
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    asyncio.run(main(int(sys.argv[1]), sys.argv[2]))
