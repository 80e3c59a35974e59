"""The ``workers:`` key: how many processes serve the listen address, and when they may.

``auto`` is the cores this process may run on (``os.sched_getaffinity``: a cgroup's CPU set or
``taskset`` counts, the machine's total does not). More than one worker needs ``state.redis``:
workers share what they learn through the fleet state, never apart (docs/adr/0021).
"""

from __future__ import annotations

import os
from typing import Any

from .fields import Reader, show

__all__ = ["MAX_WORKERS", "cores", "read_workers"]

MAX_WORKERS = 256


def cores() -> int:
    """The cores this process may use (at least 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def parse_workers(value: Any) -> int | str:
    """A worker count from ``workers:`` or ``--workers``: the number, or the problem in words."""
    if value == "auto":
        return cores()
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        return f"expected a whole number from 1 to {MAX_WORKERS} or 'auto', got {show(value)}"
    if not 1 <= value <= MAX_WORKERS:
        return f"expected from 1 to {MAX_WORKERS} (or 'auto': {cores()} here), got {value}"
    return value


def read_workers(r: Reader, data: dict[str, Any], redis: str | None) -> int:
    """``workers: N | auto`` (default 1); more than one without ``state.redis`` is a problem."""
    parsed = parse_workers(data.get("workers", 1))
    if isinstance(parsed, str):
        r.problem("workers", parsed)
        return 1
    if parsed > 1 and redis is None:
        r.problem("workers", needs_redis(parsed))
    return parsed


def needs_redis(count: int) -> str:
    return (f"{count} workers need state.redis (workers share figures, breakers and limits through "
            "the fleet state; without it each would learn apart): set state: {redis: redis://HOST:PORT/0, "
            "fleet: NAME} (a local redis-server is enough), or workers: 1")
