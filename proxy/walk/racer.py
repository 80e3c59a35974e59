"""One target racing beside a request's leader in a task of its own (``walk/race.py``): its trail, its
start, and, once it loses while being measured, the timer that cuts it at its cap; and the leader's
hedge timer, which the deadline sweeper watches."""

from __future__ import annotations

import asyncio
from typing import Protocol

from ..config import Target
from .deadlines import Countdown
from .result import Trail
from .slot import Reservation

__all__ = ["HedgeTimer", "Racing", "cut"]


class Racing:
    """A target running in a task of its own beside the leader."""
    __slots__ = ("cap", "capped", "measuring", "reserved", "started", "target", "task", "trail")

    def __init__(self, target: Target, started: float, measuring: bool, reserved: Reservation) -> None:
        self.target = target
        self.started = started
        self.measuring = measuring  # explored or measured: runs on to its own first token if it loses
        self.trail = Trail()
        self.task: asyncio.Task[None] | None = None
        self.reserved = reserved  # in flight until the racer's task runs
        self.cap: asyncio.TimerHandle | None = None  # a loser being measured: when it is cut
        self.capped = False  # the cut came: the cancel is ours, not the loop's


def cut(racer: Racing) -> None:
    """The measuring loser's cap: it has taken several times the winner's time, so stop it."""
    racer.cap = None
    task = racer.task
    if task is not None and not task.done():
        racer.capped = True
        task.cancel()


class Hedged(Protocol):
    def hedge_due(self) -> None: ...


class HedgeTimer(Countdown):
    """Watched by the deadline sweeper like an attempt: it "expires" when the hedge is due."""

    __slots__ = ("race",)

    def __init__(self, started: float, delay: float, race: Hedged) -> None:
        Countdown.__init__(self, started, delay)
        self.race = race

    def expire(self, reason: str) -> None:
        self.race.hedge_due()
