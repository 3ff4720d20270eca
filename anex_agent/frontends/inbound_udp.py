"""Inbound UDP ports for the built-in engine: ``<mesh address>:<port>/udp`` -> ``127.0.0.1:<port>``.

The user-space stack binds the UDP port at the mesh address (``ANEX_INBOUND_PORTS``'s
``PORT/udp`` items). Each mesh peer (source address and port) gets a *session*, as a NAT
mapping: a kernel UDP socket connected to ``127.0.0.1:<port>``, so the workload's replies
come back on that socket alone and go out to that peer, through the stack, from the mesh
address and the port the peer sent to. The workload sees datagrams from 127.0.0.1 (one
source port per mesh peer).

Bounds (a mesh peer may send from as many source ports as it likes):

* a session ends after :data:`IDLE_TIMEOUT` seconds without a datagram either way
  (RFC 4787 §4.3 REQ-5: a UDP mapping must not expire in less than two minutes);
* at most :data:`MAX_SESSIONS` sessions at once, all inbound UDP ports of the node together
  (each is a file descriptor); a datagram that would open one more is dropped and counted
  (``dropped_full``), with one log line each time the limit is reached.

Nothing is queued beyond the stack's and the kernel's bounded buffers: a datagram the
kernel socket cannot take now, or a reply larger than the mesh MTU allows, is dropped and
counted. No task per datagram or per session: datagrams are moved by the stack's
``on_datagram`` callback and by a reader callback per kernel socket, idle sessions are
closed by one timer per port, armed while it has sessions.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket

from anex_agent.net.datagram import MAX_DATAGRAM, READ_BATCH
from anex_agent.netstack.aio import NetstackRuntime
from anex_agent.netstack.stack import StackError

log = logging.getLogger(__name__)

#: Seconds without a datagram either way before a session's socket is closed (RFC 4787 §4.3 REQ-5).
IDLE_TIMEOUT = 120.0
#: Sessions open at once, all inbound UDP ports of a node together.
MAX_SESSIONS = 1024


class SessionBudget:
    """How many sessions may be open at once, shared by the ports of one node."""

    def __init__(self, limit: int = MAX_SESSIONS) -> None:
        self.limit = limit
        self.used = 0

    def take(self) -> bool:
        if self.used >= self.limit:
            return False
        self.used += 1
        return True

    def give(self) -> None:
        self.used -= 1


class _Session:
    __slots__ = ("peer", "sock", "last")

    def __init__(self, peer: tuple[str, int], sock: socket.socket, now: float) -> None:
        self.peer, self.sock, self.last = peer, sock, now


class UdpInboundPort:
    """One inbound UDP port of ``runtime``'s address, relayed to ``target_host:port``.

    Construct in the event loop; raises :class:`~anex_agent.netstack.stack.StackError` when the
    stack's port is taken. :meth:`close` closes the port and every session (idempotent)."""

    def __init__(self, runtime: NetstackRuntime, port: int, *, target_host: str = "127.0.0.1",
                 idle_timeout: float = IDLE_TIMEOUT, budget: SessionBudget | None = None) -> None:
        self.port = port
        self.target_host = target_host
        self.idle_timeout = idle_timeout
        self.budget = budget if budget is not None else SessionBudget()
        self._loop = asyncio.get_running_loop()
        self._sessions: collections.OrderedDict[tuple[str, int], _Session] = collections.OrderedDict()  # oldest first
        self._timer: asyncio.TimerHandle | None = None
        self._full_logged = False
        self.closed = False
        self.runtime = runtime
        self.mesh = runtime.udp_open(port)
        self.mesh.on_datagram = self._from_mesh
        #: sessions opened since start
        self.opened = 0
        #: datagrams from a new peer dropped because MAX_SESSIONS were open (or no socket could be made)
        self.dropped_full = 0
        #: datagrams dropped on the way: the kernel socket's buffer full, a reply too large for the mesh MTU
        self.dropped = 0
        #: datagrams the workload refused (nothing listened on the port: ICMP port unreachable)
        self.refused = 0

    @property
    def sessions(self) -> int:
        return len(self._sessions)

    def report(self) -> dict:
        return {"sessions": len(self._sessions), "opened": self.opened, "dropped_full": self.dropped_full,
                "dropped": self.dropped, "refused": self.refused}

    # ------------------------------------------------------------------ mesh -> workload

    def _from_mesh(self, data: bytes, peer: tuple[str, int]) -> None:
        if self.closed:
            return
        session = self._sessions.get(peer)
        if session is None:
            session = self._open(peer)
            if session is None:
                return
        else:
            self._sessions.move_to_end(peer)
            session.last = self._loop.time()
        try:
            session.sock.send(data)
        except (BlockingIOError, InterruptedError):
            self.dropped += 1
        except ConnectionRefusedError:  # an earlier datagram found no listener (ICMP port unreachable)
            self.refused += 1
        except OSError as err:
            self.dropped += 1
            log.debug("inbound %d/udp: to the workload: %s", self.port, err)

    def _open(self, peer: tuple[str, int]) -> _Session | None:
        if not self.budget.take():
            self.dropped_full += 1
            if not self._full_logged:
                self._full_logged = True
                log.warning("inbound %d/udp: %d sessions open (the most); datagrams from new mesh peers are dropped "
                            "until sessions idle for %g s end", self.port, self.budget.limit, self.idle_timeout)
            return None
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        except OSError as err:  # out of file descriptors
            self.budget.give()
            self.dropped_full += 1
            log.warning("inbound %d/udp: no socket for a new session: %s", self.port, err)
            return None
        try:
            sock.setblocking(False)
            sock.connect((self.target_host, self.port))  # replies from anywhere else never reach it
        except OSError as err:
            sock.close()
            self.budget.give()
            self.dropped += 1
            log.warning("inbound %d/udp: cannot reach %s:%d: %s", self.port, self.target_host, self.port, err)
            return None
        session = self._sessions[peer] = _Session(peer, sock, self._loop.time())
        self.opened += 1
        self._loop.add_reader(sock.fileno(), self._from_workload, session)
        self._arm()
        return session

    # ------------------------------------------------------------------ workload -> mesh

    def _from_workload(self, session: _Session) -> None:
        for _ in range(READ_BATCH):
            if self.closed or self._sessions.get(session.peer) is not session:
                return
            try:
                data = session.sock.recv(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionRefusedError:  # ICMP port unreachable: nothing listens on the workload's port
                self.refused += 1
                continue
            except OSError as err:
                log.debug("inbound %d/udp: from the workload: %s", self.port, err)
                continue
            session.last = self._loop.time()
            self._sessions.move_to_end(session.peer)
            try:
                self.mesh.sendto(data, *session.peer)
            except (StackError, OSError) as err:  # larger than the mesh MTU allows (no fragments), or closed
                self.dropped += 1
                log.debug("inbound %d/udp: to %s:%d: %s", self.port, *session.peer, err)

    # ------------------------------------------------------------------ idle sessions

    def _arm(self) -> None:
        if self._timer is None and self._sessions and not self.closed:
            oldest = next(iter(self._sessions.values()))
            self._timer = self._loop.call_at(oldest.last + self.idle_timeout, self._due)

    def _due(self) -> None:
        self._timer = None
        self.expire(self._loop.time())
        self._arm()

    def expire(self, now: float) -> int:
        """Close the sessions idle since ``now - idle_timeout`` or longer; how many were closed."""
        closed = 0
        while self._sessions:
            peer, session = next(iter(self._sessions.items()))
            if session.last + self.idle_timeout > now:
                break
            self._close_session(peer)
            closed += 1
        return closed

    def _close_session(self, peer: tuple[str, int]) -> None:
        session = self._sessions.pop(peer)
        self._loop.remove_reader(session.sock.fileno())
        session.sock.close()
        self.budget.give()
        self._full_logged = False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for peer in list(self._sessions):
            self._close_session(peer)
        self.mesh.close()
