"""Observers: they consume a finished exchange and never decide or block anything.

Each observer is one class in its own module with ``on_finished(finished)``
(synchronous, cheap: anything slow is queued to a task the observer owns) and
``async close()``. The server keeps them in one list and calls each after the
response has been sent, so a slow observer never delays a client.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from ..routing.decision import Decision
from ..traceparent import TraceContext


class Finished(NamedTuple):
    """One client exchange after it ended: the decision plus what the wire saw.

    A NamedTuple rather than a frozen dataclass: as immutable, and built once per
    request at a quarter of the cost."""

    decision: Decision | None  # None for requests refused before routing (bad JSON, 401…)
    started: float  # wall-clock epoch seconds when the request arrived
    client: str  # peer address
    method: str
    path: str
    status: int
    operation: str  # chat | completions | embeddings | messages | "" (not routed)
    stream: bool
    ttfc: float | None  # seconds from arrival to the first body byte sent to the client
    total: float  # seconds from arrival to the end of the response
    bytes_sent: int
    error: str | None = None  # why a committed stream ended early, or the error code answered
    request_id: str | None = None  # the answer's x-request-id when there is no decision
    asked: str | None = None  # the model (route) the client asked for, when there is no decision
    trace: TraceContext | None = None  # tracing on: the request's trace ids and its attempts' spans


class Observer(Protocol):
    def on_finished(self, finished: Finished) -> None: ...

    async def close(self) -> None: ...
