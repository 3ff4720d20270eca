"""The systemd notify protocol (``sd_notify(3)``), for ``Type=notify`` units with ``WatchdogSec=``.

Contract:

* :meth:`Notifier.from_environ` reads ``NOTIFY_SOCKET``, ``WATCHDOG_USEC`` and
  ``WATCHDOG_PID`` from the mapping it is given (the CLI passes ``os.environ``, then
  removes them, as ``sd_notify(unset_environment=1)`` does, so that no child talks to systemd
  in our name). Without ``NOTIFY_SOCKET`` the notifier is disabled and every call is a no-op.
* :meth:`Notifier.notify` sends one datagram of ``KEY=VALUE`` lines (``READY=1``,
  ``STATUS=...``, ``STOPPING=1``, ``WATCHDOG=1``) to the socket: a path, or an abstract
  socket when the name starts with ``@``. It never raises (a lost notification is logged).
* :attr:`Notifier.watchdog_interval`: the seconds between keep-alive pings (half of
  ``WATCHDOG_USEC``), or None when no watchdog is asked for (or it is meant for another pid).
  :meth:`Notifier.watchdog` pings from the event loop until cancelled: a loop that is stuck
  stops pinging, and systemd restarts the service.
* :func:`supervised` runs a role's main coroutine with the notifier: ``READY=1`` (and a
  ``STATUS=``) once ``ready`` is set, the watchdog pings meanwhile, ``STOPPING=1`` at the end;
  the two helper tasks are named and owned by its own TaskGroup.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Coroutine, Mapping, MutableMapping
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)

VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


class Notifier:
    def __init__(self, address: str | None, watchdog_usec: int | None = None) -> None:
        self.address = address
        self.watchdog_interval = watchdog_usec / 2e6 if watchdog_usec else None
        self._failed_logged = False

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], *, pid: int | None = None) -> Notifier:
        address = environ.get("NOTIFY_SOCKET") or None
        usec = None
        text = environ.get("WATCHDOG_USEC", "")
        if text.isascii() and text.isdigit() and int(text) > 0:
            owner = environ.get("WATCHDOG_PID", "")
            if not owner or (owner.isascii() and owner.isdigit() and int(owner) == (pid or os.getpid())):
                usec = int(text)
        return cls(address, usec)

    @staticmethod
    def scrub(environ: MutableMapping[str, str]) -> None:
        for name in VARIABLES:
            environ.pop(name, None)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, **fields: str | int) -> bool:
        """Send ``KEY=VALUE`` lines (``READY=1`` as ``notify(READY=1)``); True when sent."""
        if self.address is None:
            return False
        message = "".join(f"{key}={str(value).replace(chr(10), ' ')}\n" for key, value in fields.items())
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(message.encode(), target)
        except OSError as err:
            if not self._failed_logged:
                log.warning("systemd notification to %s failed: %s", self.address, err.strerror or err)
                self._failed_logged = True
            return False
        return True

    def status(self, text: str) -> None:
        self.notify(STATUS=text)

    async def watchdog(self) -> None:
        """Ping ``WATCHDOG=1`` every :attr:`watchdog_interval` seconds until cancelled."""
        if self.watchdog_interval is None or self.address is None:
            return
        while True:
            self.notify(WATCHDOG=1)
            await asyncio.sleep(self.watchdog_interval)


async def supervised(main: Coroutine[Any, Any, T], notifier: Notifier, ready: asyncio.Event, status: str) -> T:
    """Run ``main`` to its end; notify ``READY=1``/``STATUS=status`` once ``ready`` is set."""

    async def announce() -> None:
        await ready.wait()
        notifier.notify(READY=1, STATUS=status)

    failure: BaseException | None = None
    async with asyncio.TaskGroup() as tg:
        helpers = [tg.create_task(announce(), name="sd-ready"), tg.create_task(notifier.watchdog(), name="watchdog")]
        try:
            result = await main
        except BaseException as err:  # raised as it is below, not inside an exception group
            failure = err
        notifier.notify(STOPPING=1, STATUS="stopping")
        for task in helpers:
            task.cancel()
    if failure is not None:
        raise failure
    return result
