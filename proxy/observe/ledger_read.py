"""The decision ledger's read side: summaries for ``firstbyte decisions`` and measured costs.

Every read opens the SQLite file read-only and leaves the writer (``ledger.py``) alone; a
missing file is ``FileNotFoundError``, which callers take as "no rows yet".
"""

from __future__ import annotations

import math
import sqlite3
import time
from pathlib import Path
from typing import Any

__all__ = ["format_summary", "measured_costs", "summarise"]


def _connect_ro(path: str) -> sqlite3.Connection:
    file = Path(path)
    if not file.exists():
        raise FileNotFoundError(f"no ledger at {path}")
    return sqlite3.connect(file.resolve().as_uri() + "?mode=ro", uri=True)


def _percentile(
    conn: sqlite3.Connection, where: str, args: list[Any], count: int, q: float
) -> float | None:
    """Nearest-rank percentile in SQL, so a month of rows never lands in a Python list."""
    if count == 0:
        return None
    rank = max(1, math.ceil(q * count))
    row = conn.execute(
        f"SELECT ttfc FROM decisions WHERE {where} AND ttfc IS NOT NULL "
        "ORDER BY ttfc LIMIT 1 OFFSET ?",
        [*args, rank - 1],
    ).fetchone()
    return None if row is None else float(row[0])


def summarise(path: str, route: str | None, since_secs: float | None, now: float) -> dict[str, Any]:
    """Per-route figures for ``firstbyte decisions``: who served, how often we failed over.

    Shape: ``{"since": epoch|None, "requests": n, "routes": {route: {"requests",
    "served": {target: share}, "unserved": share, "failover_rate",
    "exploration_share", "ttfc_p50", "ttfc_p95"}}}``; shares are 0..1.
    """
    since = None if since_secs is None else now - since_secs
    conditions: list[str] = ["1=1"]
    args: list[Any] = []
    if since is not None:
        conditions.append("ts >= ?")
        args.append(since)
    if route is not None:
        conditions.append("route = ?")
        args.append(route)
    where = " AND ".join(conditions)
    routes: dict[str, Any] = {}
    total = 0
    conn = _connect_ro(path)
    try:
        rows = conn.execute(
            "SELECT route, COUNT(*), SUM(failovers > 0), SUM(first_reason = 'explore'), "
            f"COUNT(ttfc) FROM decisions WHERE {where} GROUP BY route ORDER BY route",
            args,
        ).fetchall()
        for name, count, failed_over, explored, timed in rows:
            total += count
            served = dict(
                conn.execute(
                    f"SELECT served, COUNT(*) FROM decisions WHERE {where} AND route = ? "
                    "AND served IS NOT NULL GROUP BY served ORDER BY COUNT(*) DESC, served",
                    [*args, name],
                ).fetchall()
            )
            route_where = f"{where} AND route = ?"
            route_args = [*args, name]
            routes[name] = {
                "requests": count,
                "served": {t: n / count for t, n in served.items()},
                "unserved": (count - sum(served.values())) / count,
                "failover_rate": failed_over / count,
                "exploration_share": explored / count,
                "ttfc_p50": _percentile(conn, route_where, route_args, timed, 0.50),
                "ttfc_p95": _percentile(conn, route_where, route_args, timed, 0.95),
            }
    finally:
        conn.close()
    return {"since": since, "requests": total, "routes": routes}


def _pct(share: float) -> str:
    return f"{share * 100:.1f}%"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}ms"


def format_summary(summary: dict[str, Any]) -> str:
    """A plain text table, one row per served target under its route's figures."""
    if not summary["routes"]:
        return "no decisions in the ledger for this selection\n"
    header = ("route", "requests", "failover", "explore", "ttfc p50", "ttfc p95", "served")
    table: list[tuple[str, ...]] = [header]
    for name, r in summary["routes"].items():
        served = [f"{t} {_pct(s)}" for t, s in r["served"].items()]
        if r["unserved"]:
            served.append(f"(none) {_pct(r['unserved'])}")
        first = (
            name,
            str(r["requests"]),
            _pct(r["failover_rate"]),
            _pct(r["exploration_share"]),
            _ms(r["ttfc_p50"]),
            _ms(r["ttfc_p95"]),
        )
        table.append((*first, served[0] if served else "-"))
        table.extend(("", "", "", "", "", "", s) for s in served[1:])
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = []
    for row in table:
        cells = [
            cell.ljust(widths[i]) if i in (0, len(header) - 1) else cell.rjust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def measured_costs(
    path_or_conn: str | sqlite3.Connection,
    since_secs: float = 7 * 86400,
    min_calls: int = 5,
    now: float | None = None,
) -> dict[tuple[str, str], float]:
    """Mean cost per call by (served target, operation), for the score strategy's cost signal.

    Only clean calls count (2xx, no failover, cost known), so a failover's wasted
    attempt does not inflate the target that finally answered; fewer than
    ``min_calls`` is no figure at all rather than a noisy one.
    """
    since = (time.time() if now is None else now) - since_secs
    conn = _connect_ro(path_or_conn) if isinstance(path_or_conn, str) else path_or_conn
    try:
        rows = conn.execute(
            "SELECT served, operation, AVG(cost_usd), COUNT(*) FROM decisions "
            "WHERE ts >= ? AND status BETWEEN 200 AND 299 AND failovers = 0 "
            "AND cost_usd IS NOT NULL AND served IS NOT NULL "
            "GROUP BY served, operation HAVING COUNT(*) >= ?",
            (since, min_calls),
        ).fetchall()
    finally:
        if isinstance(path_or_conn, str):
            conn.close()
    return {(served, op): float(mean) for served, op, mean, _ in rows}
