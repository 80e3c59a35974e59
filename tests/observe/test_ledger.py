from __future__ import annotations

import asyncio
import multiprocessing
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from proxy.observe import Finished
from proxy.observe.ledger import SCHEMA, Ledger, format_summary, measured_costs, summarise
from proxy.routing.decision import Attempt, Decision, Excluded, Racer, Ranked

NOW = 1_700_000_000.0
DAY = 86400.0


def decision(
    id: str,
    *,
    route: str = "chat",
    first: str = "fastest 0.31s",
    attempts: tuple[tuple[str, str], ...] = (("groq", "200"),),
    served: str | None = "groq",
    cost: float | None = None,
    usage: dict[str, int] | None = None,
) -> Decision:
    return Decision(
        id=id,
        route=route,
        strategy="fastest",
        order=(Ranked("groq", first), Ranked("openai", None, 0.82)),
        excluded=(Excluded("local", "breaker open 12s"),),
        attempts=tuple(Attempt(name, outcome, 0.25) for name, outcome in attempts),
        served=served,
        status=200 if served else 503,
        usage=usage or {},
        cost_usd=cost,
    )


def finished(d: Decision | None, *, started: float = NOW, ttfc: float | None = 0.3,
             status: int | None = None) -> Finished:
    return Finished(
        decision=d,
        started=started,
        client="10.0.0.7",
        method="POST",
        path="/v1/chat/completions",
        status=status if status is not None else (d.status if d and d.status else 400),
        operation="chat",
        stream=True,
        ttfc=ttfc,
        total=1.25,
        bytes_sent=100,
    )


def rows(path: Path) -> list[sqlite3.Row]:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute("SELECT * FROM decisions ORDER BY ts, id").fetchall()
    finally:
        conn.close()


async def test_rows_after_finished_exchanges(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    ledger = Ledger(str(path), retention_days=30, queue_size=100, clock=lambda: NOW)
    await ledger.start()
    failover = decision(
        "a1",
        attempts=(("groq", "503"), ("groq", "reset"), ("openai", "200")),
        served="openai",
        usage={"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30},
        cost=0.0042,
    )
    ledger.on_finished(finished(failover))
    ledger.on_finished(finished(None, status=401))  # refused before routing: no decision row
    ledger.on_finished(finished(decision("a2", served=None, attempts=()), started=NOW + 1,
                                ttfc=None))
    await ledger.close()

    assert ledger.written == 2
    assert ledger.dropped == 0
    first, second = rows(path)
    assert dict(first) == {
        "id": "a1",
        "ts": NOW,
        "route": "chat",
        "strategy": "fastest",
        "order": "groq(fastest 0.31s), openai(0.82s)",
        "first_reason": "fastest",
        "excluded": "local(breaker open 12s)",
        "attempts": "groq(503 0.25s), groq(reset 0.25s), openai(200 0.25s)",
        "served": "openai",
        "status": 200,
        "failovers": 1,
        "ttfc": 0.3,
        "total": 1.25,
        "stream": 1,
        "operation": "chat",
        "prompt_tokens": 10,
        "completion_tokens": 20,
        "cost_usd": 0.0042,
        "race": "",  # it did not race
        "instance": "",  # no fleet: one instance, unnamed
    }
    assert second["served"] is None
    assert second["status"] == 503
    assert second["attempts"] == ""
    assert second["ttfc"] is None
    assert second["prompt_tokens"] is None
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


async def test_blocked_writer_drops_and_counts_rows(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    gate = threading.Event()
    ledger = Ledger(str(path), retention_days=30, queue_size=3, clock=lambda: NOW, _gate=gate)
    await ledger.start()
    for i in range(10):
        ledger.on_finished(finished(decision(f"r{i}")))  # returns at once despite the writer
    assert ledger.dropped == 7
    assert ledger.written == 0
    gate.set()
    await ledger.close()
    assert ledger.written == 3
    assert [r["id"] for r in rows(path)] == ["r0", "r1", "r2"]
    ledger.on_finished(finished(decision("late")))  # after close: counted, never raised
    assert ledger.dropped == 8


async def test_retention_deletes_rows_older_than_the_setting(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    now = [NOW]
    ledger = Ledger(str(path), retention_days=30, queue_size=100, clock=lambda: now[0])
    await ledger.start()
    ledger.on_finished(finished(decision("old"), started=NOW - 40 * DAY))
    ledger.on_finished(finished(decision("kept"), started=NOW - 29 * DAY))
    ledger.on_finished(finished(decision("new"), started=NOW - 1))
    now[0] = NOW + 61  # past the once-a-minute retention pass
    ledger.on_finished(finished(decision("newest"), started=NOW + 60))
    await ledger.close()
    assert [r["id"] for r in rows(path)] == ["kept", "new", "newest"]
    assert ledger.pruned == 1

    # A ledger reopened much later prunes at start, before writing anything.
    later = Ledger(str(path), retention_days=30, queue_size=10, clock=lambda: NOW + 29.5 * DAY)
    await later.start()
    await later.close()
    assert [r["id"] for r in rows(path)] == ["new", "newest"]


async def test_start_raises_when_the_database_cannot_open(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path), retention_days=30, queue_size=10)  # a directory
    with pytest.raises(sqlite3.OperationalError):
        await ledger.start()
    await ledger.close()


async def _fill(path: Path) -> None:
    ledger = Ledger(str(path), retention_days=365, queue_size=100, clock=lambda: NOW)
    await ledger.start()
    for item, ttfc in [
        (decision("c1"), 0.1),
        (decision("c2", first="explore"), 0.2),
        (decision("c3", attempts=(("groq", "503"), ("openai", "200")), served="openai"), 0.3),
        (decision("c4", attempts=(("groq", "503"), ("openai", "timeout")), served=None), None),
    ]:
        ledger.on_finished(finished(item, started=NOW - 600, ttfc=ttfc))
    ledger.on_finished(finished(decision("d1", route="code"), started=NOW - 600, ttfc=0.5))
    ledger.on_finished(finished(decision("old", route="code"), started=NOW - 2 * DAY, ttfc=9.0))
    await ledger.close()


async def test_summarise_figures_on_known_rows(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    await _fill(path)

    summary = summarise(str(path), route=None, since_secs=3600, now=NOW)
    assert summary["requests"] == 5
    assert summary["since"] == NOW - 3600
    chat = summary["routes"]["chat"]
    assert chat["requests"] == 4
    assert chat["served"] == {"groq": 0.5, "openai": 0.25}
    assert chat["unserved"] == 0.25
    assert chat["failover_rate"] == 0.5
    assert chat["exploration_share"] == 0.25
    assert chat["ttfc_p50"] == 0.2  # nearest rank over 0.1, 0.2, 0.3
    assert chat["ttfc_p95"] == 0.3
    assert summary["routes"]["code"]["requests"] == 1  # the 2-day-old row is outside --since

    everything = summarise(str(path), route="code", since_secs=None, now=NOW)
    assert list(everything["routes"]) == ["code"]
    assert everything["routes"]["code"]["requests"] == 2
    assert everything["routes"]["code"]["ttfc_p95"] == 9.0

    table = format_summary(summary).splitlines()
    assert table[0].split() == [
        "route", "requests", "failover", "explore", "ttfc", "p50", "ttfc", "p95", "served",
    ]
    assert table[1].split() == ["chat", "4", "50.0%", "25.0%", "200ms", "300ms", "groq", "50.0%"]
    assert table[2].split() == ["openai", "25.0%"]
    assert table[3].split() == ["(none)", "25.0%"]
    assert table[4].split() == ["code", "1", "0.0%", "0.0%", "500ms", "500ms", "groq", "100.0%"]
    assert "no decisions" in format_summary(summarise(str(path), "nope", None, NOW))


def test_summarise_without_a_ledger_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no ledger"):
        summarise(str(tmp_path / "missing.db"), None, None, NOW)


async def test_measured_costs_counts_only_clean_calls(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    ledger = Ledger(str(path), retention_days=365, queue_size=100, clock=lambda: NOW)
    await ledger.start()
    for i in range(5):
        ledger.on_finished(finished(decision(f"g{i}", cost=0.001 * (i + 1)), started=NOW - 60))
    for i in range(4):  # too few calls to be a figure
        ledger.on_finished(finished(decision(f"o{i}", served="openai", cost=0.5), started=NOW))
    noisy = [
        decision("f", attempts=(("openai", "503"), ("groq", "200")), cost=9.0),  # failed over
        decision("u", cost=None),  # cost unknown
    ]
    for item in noisy:
        ledger.on_finished(finished(item, started=NOW))
    ledger.on_finished(finished(decision("s", cost=9.0), started=NOW, status=500))  # not 2xx
    ledger.on_finished(finished(decision("x", cost=9.0), started=NOW - 8 * DAY))  # too old
    await ledger.close()

    assert measured_costs(str(path), now=NOW) == {("groq", "chat"): pytest.approx(0.003)}
    conn = sqlite3.connect(path)
    try:
        assert measured_costs(conn, min_calls=4, now=NOW) == {
            ("groq", "chat"): pytest.approx(0.003),
            ("openai", "chat"): pytest.approx(0.5),
        }
    finally:
        conn.close()


async def test_a_race_is_recorded_and_an_older_ledger_gains_the_column(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    conn = sqlite3.connect(path)  # a ledger file from before races were recorded
    conn.executescript(SCHEMA.replace(",\n    race TEXT NOT NULL DEFAULT ''", "").replace(
        ",\n    instance TEXT NOT NULL DEFAULT ''", ""))  # nor which instance of a fleet served
    conn.close()
    ledger = Ledger(str(path), retention_days=30, queue_size=100, clock=lambda: NOW, instance="box-1-ab12")
    await ledger.start()
    raced = Decision(id="r1", route="chat", strategy="fastest", order=(Ranked("groq", "fastest", 0.31),),
                     attempts=(Attempt("groq", "lost", 0.5), Attempt("openai", "200", 0.2, ttfc=0.2)),
                     served="openai", status=200, race=(Racer("groq", "leader"), Racer("openai", "hedge 0.40s")))
    ledger.on_finished(finished(raced))
    await ledger.close()
    (row,) = rows(path)
    assert row["race"] == "groq(leader), openai(hedge 0.40s)"
    assert row["instance"] == "box-1-ab12"
    assert row["attempts"] == "groq(lost 0.50s), openai(200 0.20s)"


def _open_at_once(path: str, barrier: Any, out: Any) -> None:
    async def run() -> None:
        ledger = Ledger(path, retention_days=1, queue_size=8)
        barrier.wait()
        try:
            await ledger.start()
        except sqlite3.Error as exc:
            out.put(repr(exc))
            return
        await ledger.close()
        out.put("opened")

    asyncio.run(run())


def test_processes_opening_one_new_ledger_at_once_all_open_it(tmp_path: Path) -> None:
    """Two workers start together on a new file: each opens it (SQLite refused the WAL switch of
    one in about 15 such pairs with "database is locked", without waiting, and the worker failed)."""
    ctx = multiprocessing.get_context("fork")
    got: list[str] = []
    for i in range(40):
        barrier, out = ctx.Barrier(2), ctx.Queue()
        procs = [ctx.Process(target=_open_at_once, args=(str(tmp_path / f"{i}.db"), barrier, out)) for _ in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=30)
        got += [out.get(timeout=5) for _ in procs]
    assert got == ["opened"] * 80
