"""The circuit breaker per (provider, upstream model), plus Retry-After cool-downs.

Pure state machine with an injected clock: ``cooldown.failures`` consecutive
failover-safe failures open it; after the cooldown one probe is let through; a
failed probe doubles the cooldown (up to 300 s); a success closes it. A 429's
Retry-After cools the target down for the hinted time without opening it.

In a fleet (docs/adr/0016) the breaker is ``gated``: its half-open probe is the fleet's one, so
it is let through only once the fleet link has ``claimed`` it in Redis; until then the target
reads as probing (another instance may be probing it). Failures and openings heard from other
instances fold in with ``heard_failure`` and ``heard_open``. ``failed_at`` is when the newest failure
it counted happened (or was heard): a peer's success older than that closes nothing (``State.heard_sample``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import Cooldown

MAX_COOLDOWN = 300.0

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half-open"  # cooldown over: the next attempt is the probe
PROBING = "probing"  # the probe is in flight: everyone else waits for its verdict

GO, PROBE, WAIT = "go", "probe", "wait"  # what begin() allows an attempt


@dataclass(frozen=True, slots=True)
class Health:
    """What the planner needs to know: may it be tried now, and if not, for how long."""

    state: str
    seconds_left: float  # until the breaker half-opens or the cool-down ends; 0 when usable
    cooling: float  # seconds of Retry-After cool-down left
    failures: int

    @property
    def usable(self) -> bool:
        return self.state in (CLOSED, HALF_OPEN) and self.cooling <= 0

    @property
    def reason(self) -> str:
        """The exclusion reason; seconds round up so a closed-looking ``0s`` never shows."""
        if self.state == OPEN:
            return f"breaker open {math.ceil(max(self.seconds_left, self.cooling))}s"
        if self.state == PROBING:
            return "breaker probing"
        return f"cooling down {math.ceil(self.cooling)}s"

    @property
    def reopens_in(self) -> float:
        return 0.0 if self.state == PROBING else max(self.seconds_left, self.cooling)


_HEALTHY = Health(CLOSED, 0.0, 0.0, 0)


class Breaker:
    __slots__ = ("claimed", "cool_until", "cooldown", "failed_at", "failures", "gated", "open_until", "probing",
                 "state")

    def __init__(self, gated: bool = False) -> None:
        self.state = CLOSED
        self.failures = 0
        self.open_until = 0.0
        self.cooldown = 0.0
        self.cool_until = 0.0
        self.probing = False
        self.gated = gated  # in a fleet: the probe needs the fleet's claim
        self.claimed = False  # the fleet's probe claim is ours (gated only)
        self.failed_at = -math.inf  # the newest failure counted (or heard) or opening heard (this process's clock)

    def health(self, now: float) -> Health:
        cooling = max(0.0, self.cool_until - now)
        if self.state == CLOSED:
            if not cooling and not self.failures:
                return _HEALTHY  # the common case: no record to build per request
            return Health(CLOSED, 0.0, cooling, self.failures)
        if self.probing:
            return Health(PROBING, 0.0, cooling, self.failures)
        left = self.open_until - now
        if left > 0:
            return Health(OPEN, left, cooling, self.failures)
        if self.gated and not self.claimed:  # the fleet's probe is not ours (yet)
            return Health(PROBING, 0.0, cooling, self.failures)
        return Health(HALF_OPEN, 0.0, cooling, self.failures)

    def half_open(self, now: float) -> bool:
        """Open, its cooldown over and nobody probing: a fleet link may claim the probe now."""
        return self.state == OPEN and not self.probing and now >= self.open_until

    def begin(self, now: float, *, rescue: bool = False) -> str:
        """An attempt wants to start: ``GO``, ``PROBE`` (the one attempt after the cooldown) or ``WAIT``.

        The planner saw a snapshot; by the time the walker reaches the target another
        request may already be probing it, so the breaker itself lets only one through.
        ``rescue`` is health's last resort (every target unhealthy): it goes without probing.
        """
        if self.state == CLOSED:
            return GO
        if not self.probing and now >= self.open_until and (self.claimed or not self.gated):
            self.probing = True
            self.claimed = False  # spent on this probe
            return PROBE
        return GO if rescue else WAIT

    def abandon_probe(self) -> None:
        """The probe ended with no verdict (client left): let the next request probe."""
        self.probing = False

    def success(self) -> None:
        self.state = CLOSED
        self.failures = 0
        self.probing = False
        self.claimed = False
        self.cooldown = 0.0

    def failure(self, now: float, policy: Cooldown) -> None:
        self.failures += 1
        self.failed_at = max(self.failed_at, now)
        if self.state == OPEN:
            if self.probing:  # the probe failed: wait twice as long
                self.probing = False
                self.cooldown = min(MAX_COOLDOWN, self.cooldown * 2)
                self.open_until = now + self.cooldown
            return
        if self.failures >= policy.failures:
            self.state = OPEN
            self.cooldown = policy.secs
            self.open_until = now + policy.secs

    def heard_failure(self, now: float, policy: Cooldown, at: float | None = None) -> None:
        """Another instance's counted failure: it adds to the consecutive count (and may open the
        breaker here too), but it is never this instance's probe verdict. ``at``: when it was told
        (its entry's time; ``now`` without one): a peer's success older resets nothing (``State.heard_sample``)."""
        self.failures += 1
        self.failed_at = max(self.failed_at, now if at is None else at)
        if self.state == CLOSED and self.failures >= policy.failures:
            self.state = OPEN
            self.cooldown = policy.secs
            self.open_until = now + policy.secs

    def heard_open(self, until: float, cooldown: float) -> None:
        """Another instance opened the breaker (or reopened it after its probe failed) until then."""
        self.failed_at = max(self.failed_at, until - cooldown)  # when it opened there
        if self.state == OPEN and until <= self.open_until:
            return
        self.state = OPEN
        self.open_until = until
        self.cooldown = cooldown
        self.claimed = False

    def cool(self, until: float) -> None:
        self.cool_until = max(self.cool_until, until)
