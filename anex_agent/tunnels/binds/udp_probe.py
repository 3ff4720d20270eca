"""Does UDP really reach a gateway? A WireGuard handshake from a socket of its own says so.

:func:`probe_gateway` sends a handshake initiation (whitepaper §5.4.2), made with the
node's key by the built-in WireGuard core, from a fresh UDP socket to the gateway's
endpoint and waits up to ``timeout`` seconds for the gateway's response, sending a fresh
initiation every :data:`RETRY_INTERVAL` seconds meanwhile: one lost datagram, or a hub that
learns this node's key a moment after the node joined (the coordinator's watch stream
carries it there), must not make a working UDP path look blocked. A response that
completes the handshake proves that datagrams get there and back; opening a socket proves
nothing (a firewall that drops outgoing UDP lets the socket open and the send succeed).

The engine's own session is not touched (the probe has its own socket and its own
handshake state). The gateway, having answered, sends its next datagrams for this node to
the probe's socket until the engine's next datagram arrives (WireGuard follows a peer's
newest authenticated source address), so the agent sends one at once after a probe that
succeeded; a probe that failed never reached the gateway's WireGuard and changes nothing.

Initiation timestamps are blurred to 2^24 ns (whitepaper §5.4.2 as wireguard-go does it) and
a peer's initiation must be newer than the last one accepted: the probe returns only
:data:`TIMESTAMP_GRAIN` s after its initiation, so the engine's next one is never refused as
a replay of the probe's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

from anex_agent.tunnels.binds.udp import UdpBind
from anex_agent.wg.device import Device
from anex_agent.wg.peer import PeerConfig

#: How long a handshake over UDP may take before the path is judged blocked.
PROBE_TIMEOUT = 3.0
#: A fresh initiation this often while no response came (each carries a newer timestamp).
RETRY_INTERVAL = 0.5
#: More than the 2^24 ns grain of initiation timestamps.
TIMESTAMP_GRAIN = 0.02


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    reason: str
    rtt: float | None = None  # seconds from initiation to response

    def to_dict(self) -> dict:
        return {"supported": self.ok, "reason": self.reason, "rtt_ms": None if self.rtt is None else round(self.rtt * 1000, 1)}


async def probe_gateway(private_key: bytes, gateway_public_key: bytes, endpoint: tuple[str, int], *,
                        timeout: float = PROBE_TIMEOUT) -> ProbeResult:
    """One WireGuard handshake with the gateway over UDP; never raises."""
    where = f"{endpoint[0]}:{endpoint[1]}"
    try:
        bind = await UdpBind.open(0, "::" if ":" in endpoint[0] else "0.0.0.0")
    except Exception as err:  # noqa: BLE001 - reported, never raised
        return ProbeResult(False, f"cannot open a UDP socket: {err}")
    loop = asyncio.get_running_loop()
    try:
        first = loop.time()
        deadline = first + timeout
        try:
            while loop.time() < deadline:
                sent = loop.time()
                # a fresh handshake state per attempt (the core itself would wait REKEY_TIMEOUT before
                # initiating again); a response to an older attempt no longer matches and is dropped
                device = Device(private_key, wall_time=time.time)
                device.set_peer(PeerConfig(public_key=gateway_public_key, allowed_ips=(), endpoint=endpoint))
                for datagram, to in device.initiate_handshake(gateway_public_key, sent).datagrams:
                    bind.send(datagram, to)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(RETRY_INTERVAL, deadline - sent)):
                        while True:
                            data, sender = await bind.receive()
                            out = device.receive_datagram(data, sender, loop.time())
                            if "handshake-complete" in out.kinds():
                                rtt = loop.time() - sent
                                await asyncio.sleep(max(0.0, sent + TIMESTAMP_GRAIN - loop.time()))
                                return ProbeResult(True, f"a WireGuard handshake with {where} over UDP took "
                                                         f"{rtt * 1000:.0f} ms", rtt)
            raise TimeoutError
        except TimeoutError:
            return ProbeResult(False, f"no WireGuard handshake with {where} over UDP within {timeout:g} s "
                                      "(outgoing or incoming UDP is blocked on the way)")
    except Exception as err:  # noqa: BLE001 - a probe reports, it does not raise
        return ProbeResult(False, f"UDP probe of {where} failed: {type(err).__name__}: {err}")
    finally:
        bind.close()
