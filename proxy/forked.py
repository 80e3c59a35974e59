"""A worker forked from the supervisor, which has already imported the server.

A new interpreter that imports firstbyte spends most of a worker's start (measured in
docs/workers.md): a fork starts from the supervisor's imported modules, so a replaced worker
listens after little more than its own config load and warm start. The supervisor forks from
its running event loop (plain asyncio, no threads), so the child first forgets that loop and
its signal handlers, then runs the worker's ``main`` and leaves with ``os._exit`` (never
returning into the parent's loop).

:class:`Forked` is the supervisor's view of the child: the parts of
``asyncio.subprocess.Process`` it uses, with the exit heard through a pidfd (Linux).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import traceback
from collections.abc import Callable, Iterable

__all__ = ["Forked", "fork"]

_RESET = (signal.SIGHUP, signal.SIGTERM, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2)


class Forked:
    """A forked child as its parent's event loop sees it: its pid, its exit code once it ended."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._loop = asyncio.get_running_loop()
        self._done: asyncio.Future[int] = self._loop.create_future()
        self._fd = os.pidfd_open(pid)
        self._loop.add_reader(self._fd, self._reap)

    def _reap(self) -> None:
        """The pidfd is readable once the child ended: collect its status (no zombie is left)."""
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # pragma: no cover - reaped elsewhere
            pid, status = self.pid, 255 << 8
        if pid == 0:
            return
        self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self.returncode = os.waitstatus_to_exitcode(status)
        self._done.set_result(self.returncode)

    async def wait(self) -> int:
        return await asyncio.shield(self._done)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def fork(main: Callable[[], int], env: dict[str, str], drop_env: Iterable[str],
         close: Iterable[socket.socket]) -> Forked:
    """Start ``main`` in a forked child with ``env`` set (and ``drop_env`` unset) and the
    parent's sockets in ``close`` closed; the child exits with what ``main`` returns."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # nothing buffered is written twice
    pid = os.fork()
    if pid:
        return Forked(pid)
    code = 1
    try:
        _forget_parent(close)
        for name in drop_env:
            os.environ.pop(name, None)
        os.environ.update(env)
        code = main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _forget_parent(close: Iterable[socket.socket]) -> None:
    """In the child: no running loop, the default signal handlers, none of the parent's sockets."""
    asyncio.events._set_running_loop(None)
    signal.set_wakeup_fd(-1)
    for sig in _RESET:
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sock in close:
        sock.close()
