"""What the kernel can say about a client's connection, and the one way firstbyte cuts a client.

Two facts the transports do not give: how many bytes the kernel still holds for the peer (a
client that stopped reading leaves them there; one that reads slowly drains them, even while
our transport stays paused), and a close that drops them (a reset) instead of leaving the kernel
to keep offering them to a reader that may never come.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import socket
import struct
import termios

__all__ = ["reset", "unsent"]

_LINGER_OFF = struct.pack("ii", 1, 0)
_OUTQ = getattr(termios, "TIOCOUTQ", None)  # SIOCOUTQ on Linux: bytes not yet acknowledged by the peer


def reset(transport: asyncio.WriteTransport) -> None:
    """Cut a client that reads no more at once: a reset, its unsent bytes dropped. A plain close
    would leave the kernel holding our full send buffer (megabytes on loopback) for it."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError, AttributeError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_OFF)
    transport.abort()


def unsent(transport: asyncio.BaseTransport | None) -> int | None:
    """Bytes the kernel still holds for the peer; None where it cannot say (not Linux, no socket)."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or _OUTQ is None:
        return None
    try:
        return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), _OUTQ, b"\0\0\0\0"))[0])
    except (OSError, ValueError, AttributeError):
        return None
