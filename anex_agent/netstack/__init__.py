"""A user-space TCP/IP stack for one host on a point-to-point L3 link (the WireGuard tunnel).

Sans-I/O like :mod:`anex_agent.wg`: the core modules (:mod:`.checksum`, :mod:`.ipv4`,
:mod:`.icmp`, :mod:`.udp`, :mod:`.tcp`, :mod:`.stack`) take IP packets and ``now`` and
give IP packets, stream events and the next deadline; they import no asyncio, socket or
time. :mod:`.aio` is the thin asyncio adapter (connections for the Dialer, listeners for
inbound forwards, UDP for DNS).
"""
