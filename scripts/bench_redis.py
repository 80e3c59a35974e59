"""scripts/bench_redis.py: ``scripts/bench`` with and without the fleet link, interleaved, as ratios.

Issue 26's goal: a request's added latency with ``state.redis`` configured stays within 5 % of
without. One ``redis-server`` (loopback, persistence off) for the whole run; ``--pairs`` pairs of
``scripts/bench.py --quick --no-hold`` runs, one without and one with ``--redis`` (order alternating:
off, on, then on, off, so a drift of the machine hits both alike). Each bench run measures the
direct connection and the floor beside firstbyte, so every figure is read two ways: firstbyte's own
(added p50 over direct, requests per second, CPU ms per call of its process) and its ratio to the
floor's from the same run (which takes out much of what the machine's load does between runs).
Printed per phase: the median over pairs of on / off, and the range (the spread) of the pairs.

    .venv/bin/python scripts/bench_redis.py [--pairs 3] [--concurrency 1 64] [--redis-port 42300]

Writes each bench run's JSON to ``bench-results/bench-redis-{off,on}-N.json``. Not run by the test suite.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench-results"
GOAL = 1.05


def figures(path: Path) -> dict[str, dict[str, float]]:
    """Per phase: firstbyte-1's added p50, its ratio to the floor's, requests per second, CPU per call."""
    data = orjson.loads(path.read_bytes())
    rows = data["summary"]["phases"]
    cpu = data["meta"]["cpu_ms_per_call"]
    out = {}
    for phase, row in rows.items():
        fb = row["fb1"]
        out[phase] = {"added_p50_ms": fb["added_p50_ms"], "added_vs_floor": fb["vs_floor"]["added_p50_ms"],
                      "p50_ms": fb["p50_ms"], "rps": fb["rps"], "rps_vs_floor": fb["vs_floor"]["rps"]}
        if phase in cpu:
            out[phase]["cpu_ms_per_call"] = cpu[phase]
    return out


def bench(mode: str, i: int, args: argparse.Namespace, redis: str) -> dict[str, dict[str, float]]:
    out = OUT / f"bench-redis-{mode}-{i}.json"
    command = [sys.executable, str(ROOT / "scripts" / "bench.py"), "--quick", "--no-hold", "--out", str(out),
               "--concurrency", *map(str, args.concurrency), *(["--redis", redis] if mode == "on" else [])]
    print(f"pair {i + 1}/{args.pairs}: {mode}…", file=sys.stderr, flush=True)
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return figures(out)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def report(runs: dict[str, list[dict[str, dict[str, float]]]]) -> None:
    keys = ("added_p50_ms", "added_vs_floor", "p50_ms", "rps", "rps_vs_floor", "cpu_ms_per_call")
    print(f"\non / off per pair: median [range] over {len(runs['on'])} pairs (goal: within {GOAL}; rps: at least "
          f"{1 / GOAL:.3f})")
    print(f"{'phase':<14}" + "".join(f"{k:>26}" for k in keys))
    for phase in runs["off"][0]:
        cells = []
        for k in keys:
            if k not in runs["off"][0][phase]:
                cells.append(f"{'-':>26}")
                continue
            ratios = [on[phase][k] / off[phase][k] for on, off in zip(runs["on"], runs["off"], strict=True)
                      if off[phase][k] > 0]
            cells.append(f"{spread(ratios):>26}" if ratios else f"{'-':>26}")
        print(f"{phase:<14}" + "".join(cells))
    print("\nabsolute, off | on, each pair:")
    for phase in runs["off"][0]:
        for k in ("added_p50_ms", "rps", "cpu_ms_per_call"):
            if k in runs["off"][0][phase]:
                pairs = "  ".join(f"{off[phase][k]:.3f}|{on[phase][k]:.3f}"
                                  for on, off in zip(runs["on"], runs["off"], strict=True))
                print(f"  {phase:<14}{k:<17}{pairs}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    p.add_argument("--redis-port", type=int, default=42300)
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run still stops its processes
    binary = shutil.which("redis-server") or sys.exit("redis-server is not installed")
    tmp = tempfile.mkdtemp(prefix="bench-redis-")
    redis_proc = subprocess.Popen([binary, "--port", str(args.redis_port), "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no", "--dir", tmp], stdout=subprocess.DEVNULL)
    redis = f"redis://127.0.0.1:{args.redis_port}/0"
    runs: dict[str, list[Any]] = {"off": [], "on": []}
    try:
        for i in range(args.pairs):
            for mode in ("off", "on") if i % 2 == 0 else ("on", "off"):
                runs[mode].append(bench(mode, i, args, redis))
    finally:
        redis_proc.terminate()
        redis_proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    report(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
