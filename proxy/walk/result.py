"""What a walk ends with: one of four typed results, and the trail that builds it.

The server renders a result and decides nothing: which kind it is says who served
and whether the body goes back as it is.

- :class:`Committed`: a stream committed at its first token; its lease goes to the relay.
- :class:`Answered`: a buffered 2xx answer, in the client's shape.
- :class:`Rejected`: the client's own mistake (a 4xx that is not failover-safe, or a
  request no target's API can carry), returned as it is.
- :class:`Exhausted`: every target failed (or was skipped); the last failure is the answer.

Each carries the attempts in the order the targets started and the race roles, if any
raced. (Plain slotted classes, not frozen: one is built per request, and a frozen init
costs about three times as much.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ..errors import error_body, error_type
from ..routing.decision import Attempt, Racer
from .classify import Outcome
from .lease import Lease

__all__ = ["Answered", "Committed", "Exhausted", "Rejected", "Settling", "Trail", "Walked"]

NO_HEADERS: Mapping[str, str] = MappingProxyType({})
JSON_HEADERS: Mapping[str, str] = MappingProxyType({"content-type": "application/json"})


@dataclass(slots=True, eq=False)
class Settling:
    """Losing racers that run on to their own first token, to be measured: their outcomes
    (``measured``, ``capped``, a failure) are known only after the answer, so the record the
    observers get waits for ``tasks`` (bounded by the race's cap) and takes ``attempts()`` then."""

    tasks: tuple[asyncio.Task[None], ...]
    attempts: Callable[[], tuple[Attempt, ...]]


@dataclass(slots=True, eq=False)
class Committed:
    lease: Lease
    status: int
    headers: Mapping[str, str]  # the upstream's a client may see (``egress.forward_headers``), sorted at its head
    served: str
    attempts: tuple[Attempt, ...]
    race: tuple[Racer, ...] = ()
    settling: Settling | None = None


@dataclass(slots=True, eq=False)
class Answered:
    status: int
    headers: Mapping[str, str]
    body: bytes
    served: str
    attempts: tuple[Attempt, ...]
    race: tuple[Racer, ...] = ()
    settling: Settling | None = None


@dataclass(slots=True, eq=False)
class Rejected:
    status: int
    headers: Mapping[str, str]
    body: bytes  # in the client's shape
    word: str  # the outcome, for the access log
    attempts: tuple[Attempt, ...]
    race: tuple[Racer, ...] = ()
    served: None = None


@dataclass(slots=True, eq=False)
class Exhausted:
    status: int
    body: bytes  # the last failure, in the OpenAI shape
    word: str | None  # the last failure's outcome; None when every target was skipped
    attempts: tuple[Attempt, ...]
    race: tuple[Racer, ...] = ()
    served: None = None


Walked = Committed | Answered | Rejected | Exhausted


class Trail:
    """One line of attempts (the inline walk's, or one racer's), noted as they happen.

    Its end (an answer, a client error, or the last failure) replaces what an earlier
    attempt left, except that a skip never hides an upstream's error."""

    __slots__ = ("attempts", "body", "headers", "lease", "outcome", "served", "status")

    def __init__(self) -> None:
        self.attempts: list[Attempt] = []
        self.lease: Lease | None = None  # a committed stream
        self.served: str | None = None  # the target whose 2xx answer this is
        self.status = 502
        self.headers: Mapping[str, str] = NO_HEADERS
        self.body = b""
        self.outcome: Outcome | None = None  # why it ended without an answer

    def answered(self, attempt: Attempt, status: int, headers: Mapping[str, str],
                 body: bytes = b"", lease: Lease | None = None) -> None:
        self.attempts.append(attempt)
        self.served = attempt.name
        self.status, self.headers, self.body, self.lease = status, headers, body, lease

    def ended(self, attempt: Attempt, outcome: Outcome, status: int, headers: Mapping[str, str],
              body: bytes) -> None:
        """A failure or a client error: what the client gets if nothing later answers."""
        self.attempts.append(attempt)
        self.outcome, self.status, self.headers, self.body = outcome, status, headers, body

    def failed(self, attempt: Attempt, outcome: Outcome, body: bytes | None = None) -> None:
        if body is None:
            body = error_body(f"{attempt.name}: {outcome.message}", error_type(outcome.status),
                              code=outcome.word.replace(" ", "_"))
        self.ended(attempt, outcome, outcome.status, NO_HEADERS, body)

    def skipped(self, name: str, reason: str) -> None:
        """The breaker opened (or its probe left) after planning: the target was not called."""
        self.attempts.append(Attempt(name, "cooldown", 0.0, True))
        if self.outcome is None:  # otherwise the last upstream error stays the answer
            self.status, self.headers = 503, NO_HEADERS
            self.body = error_body(f"{name}: {reason}", error_type(503), code="cooldown")

    def result(self, attempts: tuple[Attempt, ...], race: tuple[Racer, ...] = ()) -> Walked:
        """The walk's verdict, with ``attempts`` (the race's merged order, or this trail's)."""
        served, outcome = self.served, self.outcome
        if served is not None:
            if self.lease is not None:
                return Committed(self.lease, self.status, self.headers, served, attempts, race)
            return Answered(self.status, self.headers, self.body, served, attempts, race)
        if outcome is not None and not outcome.failover:
            return Rejected(self.status, self.headers, self.body, outcome.word, attempts, race)
        return Exhausted(self.status, self.body, None if outcome is None else outcome.word, attempts, race)
