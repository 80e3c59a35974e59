"""scripts/bench --workers N: what the bench needs to read a box of workers.

The CPU of the whole box (the supervisor and every worker, from /proc), the box ready (every
worker answering), and the spread of new connections across the workers (which worker answered
each of many fresh connections, from /v1/health's ``box``).
"""

from __future__ import annotations

import collections
import http.client
import json
import time
from pathlib import Path

TICK_PATH = "/proc/{pid}/task/{pid}/children"


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(TICK_PATH.format(pid=pid)).read_text().split()]
    except OSError:
        return []


def tree_cpu(pid: int, tick: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its children now alive."""
    total = 0.0
    for p in [pid, *_children(pid)]:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def which_worker(port: int) -> int | None:
    """The worker that answers a new connection (None: a single process)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/v1/health")
        box = json.loads(conn.getresponse().read()).get("box")
    finally:
        conn.close()
    return None if box is None else int(box["worker"])


def wait_box(port: int, workers: int, timeout: float = 90.0) -> None:
    """Until every worker has answered a new connection (a worker imports firstbyte for seconds)."""
    seen: set[int | None] = set()
    deadline = time.monotonic() + timeout
    while len(seen) < workers:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only workers {sorted(map(str, seen))} of {workers} answered")
        try:
            seen.add(which_worker(port))
        except OSError:
            time.sleep(0.1)


def spread(port: int, connections: int = 400) -> dict[str, int]:
    """How many of ``connections`` fresh connections each worker took."""
    count = collections.Counter(which_worker(port) for _ in range(connections))
    return {str(k): v for k, v in sorted(count.items(), key=lambda kv: kv[0] or 0) if k is not None}
