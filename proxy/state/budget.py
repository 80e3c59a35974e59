"""The hedge budget of a route: how many second attempts its traffic has paid for.

A token bucket in the manner of gRPC's retry throttle (A6) and Finagle's backup-request budget:
every request of the route deposits ``max_extra`` of a token, a second attempt (a hedge, or an
explored target racing the leader) withdraws a whole one. So over any run of requests the extra
calls stay under ``max_extra`` of them (plus the bucket's small start), and a pool that is slow
everywhere cannot double its own load by hedging. Pure: no clock, no I/O.
"""

from __future__ import annotations

CAP = 5.0  # tokens a quiet route may save up for a burst of slow answers
START = 1.0  # a cold route may race its very first request (cold starts are when it pays most)


class HedgeBudget:
    __slots__ = ("refused", "share", "tokens")

    def __init__(self, share: float) -> None:
        self.share = share
        self.tokens = START
        self.refused = 0

    def deposit(self) -> None:
        """One request of the route: ``share`` of a token."""
        tokens = self.tokens + self.share
        self.tokens = CAP if tokens > CAP else tokens

    def withdraw(self, count: bool = True) -> bool:
        """Take a token for one extra attempt, or say no (and count the refusal, unless this
        request was refused once already: a request is refused at most once)."""
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        if count:
            self.refused += 1
        return False
