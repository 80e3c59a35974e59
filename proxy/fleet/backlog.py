"""What the link reads back from the stream when it joins: a bounded tail, folded a slice at a time.

Two reads fold many entries at once: the warm start (the stream's tail before the instance says it is
ready) and the catch-up after a dropped link (what came since the last entry read, while the
instance serves alone). One entry a tick can hold a busy second's events (``BATCH``, 512), so both
are bounded in bytes as well as entries: the stream is read newest first in pages of ``PAGE``
entries until ``WARM_BYTES`` of events or ``WARM_ENTRIES`` entries, then folded oldest first. A
catch-up after a long drop reaches back the newest ~25,000 events, not to where it left off (the
warm start's trade-off, ADR 0016: an older open breaker is learnt when it fails here or the fleet
says it again; older samples are older than the trackers' windows anyway).

Folding costs ~18 µs an event, so the fold pauses a millisecond every ``SLICE`` events (~7 ms): a
reconnect's catch-up of 2 MB (~0.5 s of folding) no longer holds requests, ``/healthz`` or the
deadline sweeper for its whole length. The reader's own ``XREAD`` asks for ``PAGE`` entries too (it
asked for 512: after a burst, ~260,000 events in one pass), and pauses every ``LIVE_SLICE`` events:
every member folds its peers' entries of one tick at the same instant, each up to a second of a
peer's samples, and in one pass they held every member's calls in flight at once (docs/operations.md,
"The cold start, call by call"). An entry is folded a slice at a time (``fold`` yields after each).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["LIVE_SLICE", "PAGE", "SLICE", "WARM_BYTES", "WARM_ENTRIES", "fold_in", "tail"]

WARM_ENTRIES = 5_000  # entries folded at a join at most
WARM_BYTES = 2_000_000  # and events' bytes (~25,000, ~0.5 s to fold; 5,000 busy ticks' entries were 250 MB)
PAGE = 50  # entries a read asks for (at most ~2 MB: BATCH events of ~80 bytes each)
SLICE = 400  # events folded between two pauses of a warm start or a catch-up (~7 ms)
LIVE_SLICE = 64  # ... of the reader's live entries (~1 ms): an entry is folded this many events at a time
PAUSE = 0.001  # a pause, not one turn of the loop: a request's exchange takes several turns, each would wait a slice

Entry = tuple[str, dict[str, str]]


async def tail(redis: Any, stream: str, after: str) -> list[Entry]:
    """The stream's newest entries after ``after`` (``"0-0"``: from its start), newest first, at
    most WARM_ENTRIES of them and WARM_BYTES of events."""
    entries: list[Entry] = []
    size, newest, oldest = 0, "+", "-" if after == "0-0" else _after(after)
    while size < WARM_BYTES and len(entries) < WARM_ENTRIES:
        page: Any = await redis.xrevrange(stream, max=newest, min=oldest, count=PAGE)
        for entry in page[:WARM_ENTRIES - len(entries)]:
            entries.append(entry)
            size += len(entry[1].get("e", ""))
            if size >= WARM_BYTES:
                break
        if len(page) < PAGE:
            break
        newest = _before(page[-1][0])
    return entries


async def fold_in(entries: Iterable[Entry], fold: Callable[[str, dict[str, str]], Iterable[tuple[int, int]]],
                  every: int = SLICE) -> int:
    """``fold`` each entry in order, one slice at a time (each step yields the events it read and those
    it applied), pausing PAUSE every ``every`` events, within an entry as between entries.
    Returns the events applied."""
    applied = since = 0
    for entry_id, fields in entries:
        for read, done in fold(entry_id, fields):
            applied += done
            since += read
            if since >= every:
                since = 0
                await asyncio.sleep(PAUSE)
    return applied


def _before(entry_id: str) -> str:
    """The greatest stream id below ``entry_id`` (an exclusive bound that Redis before 6.2 reads too)."""
    ms, seq = map(int, entry_id.split("-"))
    return f"{ms}-{seq - 1}" if seq else f"{ms - 1}-{2**64 - 1}"


def _after(entry_id: str) -> str:
    """The least stream id above ``entry_id``."""
    ms, seq = map(int, entry_id.split("-"))
    return f"{ms}-{seq + 1}" if seq < 2**64 - 1 else f"{ms + 1}-0"
