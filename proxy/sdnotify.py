"""The systemd notify protocol, spoken directly: one datagram per state change.

systemd (``Type=notify``) passes ``NOTIFY_SOCKET`` (a path, or ``@name`` for the
abstract namespace) and, with ``WatchdogSec=``, ``WATCHDOG_USEC`` and
``WATCHDOG_PID``. We send ``READY=1`` once listening, ``RELOADING=1`` (with
``MONOTONIC_USEC``, which systemd 253+ requires for ``Type=notify-reload`` and
older versions ignore) and ``READY=1`` around a reload, ``STOPPING=1`` when
draining, and ``WATCHDOG=1`` at half the watchdog interval.

Outside systemd every method is a silent no-op. Sending never raises into the
caller: a lost notification is logged at debug and the proxy keeps serving,
because systemd's own timeouts are the right judge of a silent service. The
socket is non-blocking, so a stuck manager can never stall the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Mapping

__all__ = ["Notifier"]

log = logging.getLogger(__name__)


class Notifier:
    """A handle on systemd's notify socket, read from the environment once."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        raw = env.get("NOTIFY_SOCKET") or None
        self.address: str | None = None
        if raw is not None and (raw.startswith(("/", "@"))):
            self.address = "\0" + raw[1:] if raw.startswith("@") else raw
        elif raw is not None:
            log.debug("sdnotify: unsupported NOTIFY_SOCKET %r; notifications off", raw)
        self._watchdog_usec = self._watchdog(env)
        self._sock: socket.socket | None = None

    @staticmethod
    def _watchdog(env: Mapping[str, str]) -> int | None:
        try:
            usec = int(env.get("WATCHDOG_USEC", ""))
        except ValueError:
            return None
        if usec <= 0:
            return None
        pid = env.get("WATCHDOG_PID")
        if pid:
            try:
                if int(pid) != os.getpid():
                    return None  # the watchdog is meant for another process (our parent)
            except ValueError:
                return None
        return usec

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, *fields: str) -> bool:
        """Send ``KEY=value`` lines as one datagram; False when off or it could not be sent."""
        if self.address is None:
            return False
        message = "\n".join(fields).encode("utf-8", "replace")
        try:
            if self._sock is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                sock.setblocking(False)
                self._sock = sock
            self._sock.sendto(message, self.address)
        except OSError as exc:
            log.debug("sdnotify: cannot send %r to %r: %s", fields, self.address, exc)
            return False
        return True

    def ready(self) -> bool:
        return self.notify("READY=1")

    def reloading(self) -> bool:
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={usec}")

    def stopping(self) -> bool:
        return self.notify("STOPPING=1")

    def status(self, text: str) -> bool:
        """A one-line status for ``systemctl status``; newlines would start new fields."""
        return self.notify("STATUS=" + " ".join(text.splitlines()))

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def watchdog_interval(self) -> float | None:
        """Seconds between pings: half of ``WATCHDOG_USEC``, as sd_watchdog_enabled(3) advises."""
        if self.address is None or self._watchdog_usec is None:
            return None
        return self._watchdog_usec / 2 / 1_000_000

    async def run_watchdog(self) -> None:
        """Ping until cancelled; returns at once when no watchdog is configured.

        It runs on the event loop on purpose: a loop too stuck to run it is the
        hang the watchdog exists to catch.
        """
        interval = self.watchdog_interval()
        if interval is None:
            return
        while True:
            self.watchdog()
            await asyncio.sleep(interval)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
