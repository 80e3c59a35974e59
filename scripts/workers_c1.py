"""Added latency at concurrency 1: one worker against two, their calls interleaved one by one.

Issue 27 asks two workers to add at most 5 % to one worker's latency at concurrency 1. Two separate
bench runs drift by +-15 % between runs on a shared machine, so this starts both boxes (each its own
fleet on one Redis) beside a direct connection to the same simulated upstream and lets the load
generator take them in turns, call by call, as ``scripts/bench`` does for its concurrency-1 phases.

    redis-server --port 43500 --save '' --appendonly no --daemonize yes
    .venv/bin/python scripts/workers_c1.py --redis redis://127.0.0.1:43500/0
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import bench
from bench import BODY, PATH, Loadgen, Procs, free_port, simulate, summarise


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--redis", required=True, help="the Redis both boxes share state through (two fleets)")
    p.add_argument("--calls", type=int, default=1000, help="calls per box per repeat")
    p.add_argument("--repeats", type=int, default=4)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="firstbyte-workers-c1-"))
    procs, gen = Procs(tmp), None
    try:
        sim = free_port()
        simulate(procs, "sim", sim, 2.0, 0, 8)
        ports = {"direct": sim, "w1": free_port(), "w2": free_port()}
        bench.REDIS = args.redis
        for name, workers in (("w1", 1), ("w2", 2)):
            bench.WORKERS = workers
            bench.firstbyte(procs, name, ports[name], sim, tmp)
        gen = Loadgen()
        urls = {name: f"http://127.0.0.1:{port}{PATH}" for name, port in ports.items()}
        for stream in (False, True):
            mode, ratios = "streamed" if stream else "buffered", []
            for i in range(args.repeats):
                each = gen.call({"op": "rounds", "urls": urls, "bodies": {name: BODY for name in ports},
                                 "stream": stream, "requests": args.calls, "warmup": 50})
                p50 = {name: summarise(calls)["p50_ms"] for name, calls in each.items()}
                added = {name: p50[name] - p50["direct"] for name in ("w1", "w2")}
                ratios.append(added["w2"] / added["w1"])
                print(f"{mode} {i + 1}: direct p50 {p50['direct']:.2f} ms, added by 1 worker {added['w1']:.3f} ms, "
                      f"by 2 workers {added['w2']:.3f} ms, 2/1 {ratios[-1]:.3f}", flush=True)
            print(f"{mode}: added p50, 2 workers / 1, median {statistics.median(ratios):.3f} "
                  f"[{min(ratios):.3f}-{max(ratios):.3f}] (goal <= 1.05)", flush=True)
    finally:
        if gen is not None:
            gen.close()
        procs.stop_all()


if __name__ == "__main__":
    main()
