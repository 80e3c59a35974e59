"""Measured cost per call, carried from the ledger to the planner's state snapshot.

The score strategy ranks on what calls actually cost, but the planner is pure
and must not touch SQLite. This background task reads the ledger's mean cost
per clean call (last 7 days, at least 5 calls, per target and operation) off
the event loop every ``interval`` seconds and swaps the result into
``State.costs`` in one assignment. A missing or unreadable ledger leaves the
last figures in place: the planner falls back to declared prices on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable

from ..state import State
from .ledger import measured_costs

__all__ = ["REFRESH_SECS", "CostRefresher"]

log = logging.getLogger(__name__)

REFRESH_SECS = 30.0
WINDOW_SECS = 7 * 86400.0
MIN_CALLS = 5


class CostRefresher:
    def __init__(self, path: str | Callable[[], str | None], state: State, interval: float = REFRESH_SECS,
                 clock: Callable[[], float] = time.time) -> None:
        # A callable follows the running config, so a reload that moves or sets the ledger is heard.
        self.path_of: Callable[[], str | None] = path if callable(path) else (lambda: path)
        self.state = state
        self.interval = interval
        self.clock = clock
        self._task: asyncio.Task[None] | None = None  # kept: a bare task may be collected

    async def refresh(self) -> None:
        """Read the ledger once and publish the figures."""
        path = self.path_of()
        if not path:
            return
        try:
            costs = await asyncio.to_thread(measured_costs, path, WINDOW_SECS, MIN_CALLS, self.clock())
        except FileNotFoundError:
            return  # the ledger has not written its first row yet
        except sqlite3.Error as exc:
            log.warning("cost refresh from %s failed: %s", path, exc)
            return
        self.state.costs = costs

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="firstbyte-costs")

    async def _run(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.interval)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
