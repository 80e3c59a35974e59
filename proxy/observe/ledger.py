"""The decision ledger: every routed decision as a row in SQLite, off the request path.

``on_finished`` turns the record into a row tuple and ``put_nowait``s it on a
bounded queue; nothing else happens on the event loop. One dedicated writer
thread owns the sqlite3 connection (a connection belongs to the thread that made
it, and a dedicated thread means the loop never waits on disk or a lock). It
drains the queue in batches, one transaction each, and deletes rows older than
``retention_days`` at start and then about once a minute. When the queue is
full the row is dropped and counted in ``dropped``; a batch that fails to write
is counted there too. A request never waits for the ledger.

Rows hold the decision in header form (order, exclusions, attempts), status,
timings and token counts; never content or keys. The read side (``firstbyte
decisions``, the score strategy's measured costs) is ``ledger_read.py``, re-exported here.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

from ..routing.decision import format_attempts, format_excluded, format_order
from . import Finished
from .ledger_read import format_summary, measured_costs, summarise

__all__ = ["SCHEMA", "Ledger", "format_summary", "measured_costs", "summarise"]

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS decisions (
    id TEXT NOT NULL,
    ts REAL NOT NULL,
    route TEXT NOT NULL,
    strategy TEXT NOT NULL,
    "order" TEXT NOT NULL,
    first_reason TEXT NOT NULL,
    excluded TEXT NOT NULL,
    attempts TEXT NOT NULL,
    served TEXT,
    status INTEGER NOT NULL,
    failovers INTEGER NOT NULL,
    ttfc REAL,
    total REAL NOT NULL,
    stream INTEGER NOT NULL,
    operation TEXT NOT NULL,
    prompt_tokens INTEGER,
    completion_tokens INTEGER,
    cost_usd REAL,
    race TEXT NOT NULL DEFAULT '',
    instance TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS decisions_ts ON decisions (ts);
CREATE INDEX IF NOT EXISTS decisions_route_ts ON decisions (route, ts);
"""

_COLUMNS = (
    "id, ts, route, strategy, \"order\", first_reason, excluded, attempts, served, status, "
    "failovers, ttfc, total, stream, operation, prompt_tokens, completion_tokens, cost_usd, race, instance"
)
_INSERT = f"INSERT INTO decisions ({_COLUMNS}) VALUES ({', '.join('?' * 20)})"

BATCH_SIZE = 500
PRUNE_EVERY_SECS = 60.0
_IDLE_POLL_SECS = 1.0
_STOP = object()

Row = tuple[Any, ...]


def row_of(finished: Finished, instance: str = "") -> Row | None:
    """The row for one exchange, or None when nothing was routed (no decision to keep); ``instance``:
    which instance of a fleet served it ("" alone)."""
    d = finished.decision
    if d is None:
        return None
    return (
        d.id,
        finished.started,
        d.route,
        d.strategy,
        format_order(d.order),
        d.first_reason,
        format_excluded(d.excluded),
        format_attempts(d.attempts),
        d.served,
        finished.status,
        d.failovers,
        finished.ttfc,
        finished.total,
        int(finished.stream),
        finished.operation,
        d.usage.get("prompt_tokens"),
        d.usage.get("completion_tokens"),
        d.cost_usd,
        ", ".join(f"{r.name}({r.role})" for r in d.race),  # racers and why each ran; "" when none did
        instance,
    )


OPEN_TIMEOUT = 5.0  # seconds another process may hold the file while this one opens it


def _into_wal(conn: sqlite3.Connection) -> None:
    """Switch to WAL, waiting out another process doing the same. SQLite answers this pragma
    "database is locked" at once, without its busy handler, when a second process is switching a
    new file too: two workers started together failed about 1 open in 15 so (a test repeats it)."""
    deadline = time.monotonic() + OPEN_TIMEOUT
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


class Ledger:
    """Observer that stores each decision in SQLite through one writer thread.

    ``_gate`` is for tests: while it is unset the writer waits before taking
    anything from the queue, which lets a test fill the queue and see drops.
    """

    def __init__(
        self,
        path: str,
        retention_days: float,
        queue_size: int,
        clock: Callable[[], float] = time.time,
        *,
        batch_size: int = BATCH_SIZE,
        instance: str = "",
        _gate: threading.Event | None = None,
    ) -> None:
        self.path = path
        self.instance = instance  # in a fleet: this instance's name, on each row
        self.retention_days = retention_days
        self.clock = clock
        self.batch_size = batch_size
        self.written = 0
        self.pruned = 0
        self._dropped_full = 0  # counted on the loop
        self._dropped_failed = 0  # counted by the writer thread
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self._gate = _gate
        self._thread: threading.Thread | None = None
        self._closed = False
        self._next_prune = 0.0

    @property
    def dropped(self) -> int:
        """Rows that never reached the file: queue full, or their batch failed."""
        return self._dropped_full + self._dropped_failed

    async def start(self) -> None:
        """Open the database (schema, WAL) and start the writer; raises if it cannot open."""
        ready: queue.Queue[BaseException | None] = queue.Queue(maxsize=1)
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="firstbyte-ledger", daemon=True
        )
        self._thread.start()
        # Wait for the open off the loop: a slow disk or a locked file must not stall it.
        error = await asyncio.to_thread(ready.get)
        if error is not None:
            await asyncio.to_thread(self._thread.join)
            self._thread = None
            raise error

    def on_finished(self, finished: Finished) -> None:
        row = row_of(finished, self.instance)
        if row is None:
            return
        if self._closed:
            self._dropped_full += 1
            return
        try:
            self._queue.put_nowait(row)
        except queue.Full:
            self._dropped_full += 1

    async def close(self) -> None:
        """Write what is queued, then stop the writer and close the file."""
        if self._closed:
            return
        self._closed = True
        thread, self._thread = self._thread, None
        if thread is None:  # never started: what was queued will not be written
            self._dropped_full += self._queue.qsize()
            return
        await asyncio.to_thread(self._stop, thread)

    def _stop(self, thread: threading.Thread) -> None:
        while thread.is_alive():
            try:
                self._queue.put(_STOP, timeout=0.5)
                break
            except queue.Full:
                continue  # the writer is draining, or it died and is_alive() will say so
        thread.join()

    # -- the writer thread -------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=OPEN_TIMEOUT, isolation_level=None)
        _into_wal(conn)
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.executescript(SCHEMA)
        columns = {row[1] for row in conn.execute("PRAGMA table_info(decisions)")}
        if "race" not in columns:  # a ledger written before races were recorded
            conn.execute("ALTER TABLE decisions ADD COLUMN race TEXT NOT NULL DEFAULT ''")
        if "instance" not in columns:  # a ledger written before fleets
            conn.execute("ALTER TABLE decisions ADD COLUMN instance TEXT NOT NULL DEFAULT ''")
        return conn

    def _run(self, ready: queue.Queue[BaseException | None]) -> None:
        try:
            conn = self._open()
        except (sqlite3.Error, OSError) as exc:
            ready.put(exc)
            return
        ready.put(None)
        try:
            self._prune_if_due(conn)
            while True:
                if self._gate is not None:
                    self._gate.wait()
                try:
                    first = self._queue.get(timeout=_IDLE_POLL_SECS)
                except queue.Empty:
                    self._prune_if_due(conn)
                    continue
                batch: list[Row] = []
                stop = first is _STOP
                if not stop:
                    batch.append(first)
                while not stop and len(batch) < self.batch_size:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is _STOP:
                        stop = True
                    else:
                        batch.append(item)
                self._write(conn, batch)
                self._prune_if_due(conn)
                if stop:
                    return
        finally:
            conn.close()

    def _write(self, conn: sqlite3.Connection, batch: list[Row]) -> None:
        if not batch:
            return
        try:
            with conn:
                conn.execute("BEGIN")
                conn.executemany(_INSERT, batch)
        except sqlite3.Error as exc:
            self._dropped_failed += len(batch)
            log.warning("ledger: dropped %d rows: %s", len(batch), exc)
        else:
            self.written += len(batch)

    def _prune_if_due(self, conn: sqlite3.Connection) -> None:
        now = self.clock()
        if now < self._next_prune:
            return
        self._next_prune = now + PRUNE_EVERY_SECS
        cutoff = now - self.retention_days * 86400.0
        try:
            with conn:
                cursor = conn.execute("DELETE FROM decisions WHERE ts < ?", (cutoff,))
            self.pruned += cursor.rowcount
        except sqlite3.Error as exc:
            log.warning("ledger: retention delete failed: %s", exc)
