"""Measured cost per call, read from the decision ledger into the state for the score strategy.

Not an observer (it writes the state, through ``State.set_costs``): a task of its own that the
gateway starts and stops beside the state it feeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable

from ..state import State
from .ledger_read import measured_costs

__all__ = ["MIN_CALLS", "REFRESH_SECS", "WINDOW_SECS", "CostRefresher"]

log = logging.getLogger("firstbyte")

REFRESH_SECS = 30.0  # how often measured costs are read from the ledger
WINDOW_SECS = 7 * 86400.0
MIN_CALLS = 5


class CostRefresher:
    """Measured cost per call, carried from the ledger into ``State.costs`` for the score strategy.

    The planner is pure and must not touch SQLite, and observers do not write state: this task,
    owned by the gateway that owns the state, reads the ledger's mean cost per clean call (last
    7 days, at least ``MIN_CALLS`` calls, per target and operation) off the event loop every
    ``interval`` seconds and swaps the result in with one assignment. A missing or unreadable
    ledger leaves the last figures in place: the planner falls back to declared prices on its own.
    """

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
        self.state.set_costs(costs)

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
