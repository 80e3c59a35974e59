"""The observers' outbox: finished exchanges queued on the request path, handed over off it.

A handler puts a :class:`~proxy.observe.Finished` here before aiohttp writes a buffered
response; the observers get it on the next turn of the loop, after the write, in batches. The
list of observers is swapped whole on reload (``Hub.reconfigure``), so an exchange lands in
the observers of its time, never in a closed one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from ..routing.decision import Attempt
from . import Finished, Observer

__all__ = ["Outbox", "Settles"]

log = logging.getLogger("firstbyte")


class Settles(Protocol):
    """Losing racers still being measured (``walk.result.Settling``): the record waits for them."""

    @property
    def tasks(self) -> tuple[asyncio.Task[None], ...]: ...

    @property
    def attempts(self) -> Callable[[], tuple[Attempt, ...]]: ...


class Outbox:
    def __init__(self, observers: list[Observer] | None = None) -> None:
        self.observers: list[Observer] = observers or []
        self._finished: list[Finished] = []

    def finished(self, finished: Finished) -> None:
        """Queue a finished exchange; the observers run on the next turn of the loop."""
        self._finished.append(finished)
        if len(self._finished) == 1:
            try:
                asyncio.get_running_loop().call_soon(self.notify)
            except RuntimeError:  # no loop: a synchronous caller, tell them now
                self.notify()

    def finished_when_settled(self, finished: Finished, settling: Settles) -> None:
        """Queue ``finished`` once the losers still being measured have ended, with their own
        outcomes (``measured``, ``capped``…) in its attempts instead of ``measuring``: they are
        bounded by the race's cap, and the access log, metrics and ledger then say what happened."""
        decision = finished.decision
        pending = {task for task in settling.tasks if not task.done()}

        def hand_over() -> None:
            settled = None if decision is None else decision.but(attempts=settling.attempts())
            self.finished(finished._replace(decision=settled))

        def ended(task: asyncio.Task[None]) -> None:
            pending.discard(task)
            if not pending:
                hand_over()

        if not pending:
            hand_over()
        for task in pending:
            task.add_done_callback(ended)

    def notify(self) -> None:
        """Hand every queued exchange to every observer; one failing never affects the others."""
        batch, self._finished = self._finished, []
        for observer in self.observers:
            try:
                for finished in batch:
                    observer.on_finished(finished)
            except Exception:
                log.exception("observer %s failed", type(observer).__name__)

    def swap(self, observers: list[Observer]) -> None:
        """Take a new list of observers (a reload): what finished so far goes to the old ones
        first, in the same step, with no await in between."""
        self.notify()
        self.observers = observers
