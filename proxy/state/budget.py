"""The hedge budget of a route: how many second attempts its traffic has paid for.

A token bucket in the manner of gRPC's retry throttle (A6) and Finagle's backup-request budget:
every request of the route deposits ``max_extra`` of a token, a second attempt (a hedge, or an
explored target racing the leader) withdraws a whole one. So over any run of requests the extra
calls stay under ``max_extra`` of them (plus the bucket's small start), and a pool that is slow
everywhere cannot double its own load by hedging. Pure: no clock, no I/O (times come in).

Two kinds of extra call draw on it. A timed hedge cuts a client's tail; an exploring racer
(a stale figure refreshed, a random explore) only learns. Learning is cheap and always
wanted, so left alone it would spend every token before a stall needs one: an explore may
take a token only while ``RESERVE`` more stay in the bucket, a hedge may take the last one.

A target that was never measured races once for free (``free_measure``): once per target
until a sample of it arrives. A target that fails before its first token every time (a
wrong key, a wrong model name) never gets a sample, so it gets no second free call: it is
explored like any other, on the budget.

The start token and the free measures are *advances* (``owed``): the route's first deposits repay
them before the bucket grows. So a cold route still races at once, and over any run longer than
the repayment (ten requests a call at ``max_extra: 0.1``) its extra calls stay under ``max_extra``
of its requests, cold start included (issue 28 measured 10.6-11.1 % over 3 s runs without it).

A leader demoted (two lower bounds in a row, docs/adr/0022) while requests wait on it with their
hedge refused is raced by them at once on *borrowed* tokens (``borrow``, ``waiting``): advances too,
repaid before the bucket grows, at most ``CAP`` owed. A refused hedge is such evidence only once the route
has ``earned`` a token of its own (its cold start's advances repaid once): before, every refusal is the
advances', whatever the leader does (docs/adr/0023, "Not in the cold start").

It also counts the route's requests and when the route last ran each target (``look``): how
many requests a figure has gone unlooked at, which paces exploring by the route's traffic
rather than the clock (``routing/explore.py``, docs/adr/0023).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

CAP = 5.0  # tokens a quiet route may save up for a burst of slow answers
START = 1.0  # a cold route may race its very first request (cold starts are when it pays most); owed
RESERVE = 1.0  # tokens an explore leaves in the bucket for a hedge
ROUNDING = 1e-9  # ten deposits of 0.1 make a token, though the floats sum to 0.9999999999999999


FREE = "free"  # how a learner is paid: an unmeasured target's one free measure
PAID = "paid"  # a token of the bucket
BORROWED = "borrowed"  # an advance: a cold route's measure that its free and paid calls left unmeasured


class HedgeBudget:
    __slots__ = ("earned", "freed", "lent", "looked", "looked_at", "owed", "refused", "requests", "share", "tokens",
                 "waiting")

    def __init__(self, share: float) -> None:
        self.share = share
        self.tokens = START
        self.owed = START  # advanced calls (the start token, free measures) the next deposits repay first
        self.refused = 0
        self.earned = False  # a deposit has grown the bucket: the cold start's advances were repaid once
        self.freed: dict[Hashable, float] = {}  # (target key, mode) -> when its free measure started
        self.lent: set[Hashable] = set()  # (target key, mode) measured once on a borrowed token (``lends``)
        self.requests = 0  # the route's requests so far (deposits)
        self.looked: dict[Hashable, int] = {}  # (target key, mode) -> the request that last ran it
        self.looked_at: dict[Hashable, float] = {}  # (target key, mode) -> when that run began
        # (leader key, mode) -> the requests past that leader's hedge delay whose hedge was refused:
        # re-raced on a borrowed token when the leader is demoted (walk/race.py)
        self.waiting: dict[Hashable, set[Any]] = {}

    def owes_free_measure(self, key: Hashable, measured_at: float | None) -> bool:
        """Would ``key``, unmeasured, race without a token now? Yes once; again only after a sample
        of it arrived (``measured_at``, its newest) since the last free one started. A read."""
        given = self.freed.get(key)
        return given is None or (measured_at is not None and measured_at >= given)

    def affords(self, share: float, keep: float = 0.0) -> bool:
        """After this request's deposit of ``share``, would a token leave ``keep`` behind? A read:
        the plan decides with it, the race then spends or refuses as decided."""
        tokens = self.tokens + self._gain(share)
        return (CAP if tokens > CAP else tokens) >= 1.0 + keep - ROUNDING

    def free_measure(self, key: Hashable, now: float, measured_at: float | None) -> bool:
        """Claim ``key``'s free measure if it is owed one (``owes_free_measure``)."""
        if not self.owes_free_measure(key, measured_at):
            return False
        self.claim_free(key, now)
        return True

    def claim_free(self, key: Hashable, now: float) -> None:
        """``key``'s free measure starts now: an advance the next deposits repay."""
        self.freed[key] = now
        self.owed += 1.0

    def lends(self, key: Hashable) -> bool:
        """Would ``key``, unmeasured with its free call spent and no token to pay, be measured on a
        borrowed one? Once per target, and only while the cold start's advances are repaid: its free
        and paid measures both failed (a 5 % failing target, one cold start in 400), and with nothing
        earned for some thirty requests it would lead every header with ``budget exhausted``. A read."""
        return self.owed > 0.0 and key not in self.lent and self.owed + 1.0 <= CAP + ROUNDING

    def pay(self, pays: str, key: Hashable, now: float) -> None:
        """A learner ``key`` starts, paid as the plan said: ``FREE``, ``PAID`` or ``BORROWED``."""
        if pays == FREE:
            self.claim_free(key, now)
        elif pays == BORROWED:  # ``lends`` said the cap allows it
            self.lent.add(key)
            self.borrow()
        else:
            self.spend()

    def deposit(self) -> None:
        """One request of the route: ``share`` of a token."""
        self.requests += 1
        gain = self._gain(self.share)
        owed = self.owed - (self.share - gain)
        self.owed = owed if owed > ROUNDING else 0.0
        if gain > 0.0:
            self.earned = True
        tokens = self.tokens + gain
        self.tokens = CAP if tokens > CAP else tokens

    def _gain(self, share: float) -> float:
        """What a deposit of ``share`` adds to the bucket once it has repaid what is owed."""
        owed = self.owed
        return share if owed <= 0.0 else (share - owed if share > owed else 0.0)

    def withdraw(self, count: bool = True, keep: float = 0.0) -> bool:
        """Take a token for one extra attempt, leaving ``keep`` (an explore leaves ``RESERVE``),
        or say no (and count the refusal, unless this request was refused once already: a
        request is refused at most once)."""
        if self.tokens >= 1.0 + keep - ROUNDING:
            self.spend()
            return True
        if count:
            self.refuse()
        return False

    def look(self, key: Hashable, now: float | None = None) -> None:
        """The route ran ``key`` in this request to its own first token (a leader, a learner, a
        measured hedge), beginning ``now``: its figure is as fresh as this request."""
        self.looked[key] = self.requests
        if now is not None:
            self.looked_at[key] = now

    def unlooked(self, key: Hashable) -> int:
        """The route's requests since it last ran ``key`` (all of them if it never did). A read."""
        return self.requests - self.looked.get(key, 0)

    def borrow(self) -> bool:
        """A token advanced (owed, as the start token is) for a call already waiting on a leader just
        demoted: the next deposits repay it before the bucket grows, so over a run the extra calls still
        stay within ``max_extra`` of the requests. At most ``CAP`` owed: a demotion with a hundred calls
        waiting re-races five of them, not a hundred."""
        if self.owed + 1.0 > CAP + ROUNDING:
            return False
        self.owed += 1.0
        return True

    def spend(self) -> None:
        """A token for one extra attempt."""
        self.tokens -= 1.0

    def refuse(self) -> None:
        """A request the budget said no to (once per request)."""
        self.refused += 1
