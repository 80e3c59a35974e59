"""Two (or more) processes writing one ledger at once, as a box's workers do: rows lost, rows per second.

Each process opens the ledger as a worker does (``Ledger._open``: WAL, a 5 s busy timeout) and writes
``--rows`` rows through ``Ledger._write`` in transactions of ``--batch`` rows, as fast as it can (a
worker's writer thread takes whatever has queued: one row at a time under a light load). Prints, per
``--begin`` mode, the rows in the file against the rows sent, the rows the writers dropped, and the rate.

    .venv/bin/python scripts/ledger_contention.py --processes 2 --rows 5000 --batch 1
"""

from __future__ import annotations

import argparse
import multiprocessing
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from proxy.observe import ledger as ledger_module  # noqa: E402
from proxy.observe.ledger import Ledger  # noqa: E402


def writer(path: str, rows: int, batch: int, begin: str, start: float, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    ledger = Ledger(path, 30.0, 10, instance="w")
    conn = ledger._open()
    while time.time() < start:
        time.sleep(0.001)
    t0 = time.perf_counter()
    for i in range(0, rows, batch):
        rows_now = [_row(i + j) for j in range(min(batch, rows - i))]
        if begin == "BEGIN":
            ledger._write(conn, rows_now)  # the ledger's own write, as it is
        else:
            _write(ledger, conn, rows_now, begin)
    out.put((ledger.written, ledger._dropped_failed, time.perf_counter() - t0))
    conn.close()


def _write(ledger: Ledger, conn: sqlite3.Connection, batch: list[tuple[object, ...]], begin: str) -> None:
    """``Ledger._write`` with another BEGIN."""
    try:
        with conn:
            conn.execute(begin)
            conn.executemany(ledger_module._INSERT, batch)
    except sqlite3.Error:
        ledger._dropped_failed += len(batch)
    else:
        ledger.written += len(batch)


def _row(i: int) -> tuple[object, ...]:
    """A row shaped as ``row_of`` makes them (the ledger's 20 columns)."""
    return (f"req-{i}", time.time(), "chat", "ordered", "p/m", "first", "", "p/m:200", "p/m", 200, 0, 0.01,
            0.02, 1, "chat", 10, 20, 0.0, "", "w")


def run(processes: int, rows: int, batch: int, begin: str) -> None:
    path = str(Path(tempfile.mkdtemp(prefix="ledger-")) / "ledger.db")
    Ledger(path, 30.0, 10)._open().close()  # the schema, once
    out: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    start = time.time() + 0.5
    procs = [multiprocessing.Process(target=writer, args=(path, rows, batch, begin, start, out))
             for _ in range(processes)]
    for p in procs:
        p.start()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    with sqlite3.connect(path) as db:
        stored = db.execute("SELECT count(*) FROM decisions").fetchone()[0]
    sent = processes * rows
    slowest = max(r[2] for r in results)
    print(f"{begin:<16} batch {batch:>3}: {stored} of {sent} rows stored, {sum(r[1] for r in results)} dropped, "
          f"{sent / slowest:,.0f} rows/s in all ({slowest:.2f} s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--rows", type=int, default=5000)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 50])
    ap.add_argument("--begin", nargs="+", default=["BEGIN", "BEGIN IMMEDIATE"])
    args = ap.parse_args()
    assert ledger_module.BATCH_SIZE  # the worker's own batches are up to this
    for batch in args.batch:
        for begin in args.begin:
            run(args.processes, args.rows, batch, begin)


if __name__ == "__main__":
    main()
