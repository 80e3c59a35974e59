"""What the kernel can say about a client's connection, and the one way firstbyte cuts a client.

Two facts the transports do not give: how many bytes the kernel still holds for the peer (a
client that stopped reading leaves them there; one that reads slowly drains them, even while
our transport stays paused), and a close that drops them (a reset) instead of leaving the kernel
to keep offering them to a reader that may never come. And how many connections the descriptor
limit carries (``fd_budget``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import resource
import socket
import struct
import termios

__all__ = ["fd_budget", "raise_fd_limit", "reset", "unsent"]

FD_RESERVE = 64  # descriptors kept for the listener sockets, the ledger, logs and the loop itself
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


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one (a service should not live under 1,024); the soft
    limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def fd_budget() -> int:
    """Client connections the descriptor limit can carry: each with one upstream connection, plus
    half as many again waiting past the cap (one descriptor each)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return 1 << 30
    return max(1, (soft - FD_RESERVE) * 2 // 5)
