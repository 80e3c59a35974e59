"""scripts/instructions: CPU instructions per relayed call, firstbyte against the floor.

Wall-clock and CPU-time figures on a shared 2-core machine move by 5-10 % from
run to run; an instruction count does not. This runs the floor
(``scripts/floor.py``) and firstbyte (a one-target route) under valgrind's
callgrind with collection off, warms each up, switches collection on for
``--calls`` calls at concurrency 16 from ``scripts/loadgen.py``, and prints the
instructions per call and firstbyte's ratio to the floor, buffered and
streamed. Repeat runs agree to about 1-2 %. Use it to see what a change to the
hot path costs; ``scripts/bench`` remains the measure of latency and
throughput. Needs valgrind (Debian package ``valgrind``).

    scripts/instructions [--calls 300] [--other NAME=DIR ...] [--unhedged NAME ...] [--see] [--redis URL]

``--see`` adds ``firstbyte-see``: this code with every request traced to a loopback OTLP sink and
the status page's data polled every second (``scripts/bench --see``), ``firstbyte-traces``, traced
alone, and ``firstbyte-status``, the page polled alone; their counts include the exports and the
polls that fell in the counted window (printed on stderr). Under callgrind a call is about 100
times slower, so what happens per second (a poll, an export every ``export_every``) falls on far
fewer calls than at full speed and its share is overstated: ``--see-every 60`` leaves only the
exports a full batch of 512 spans triggers, as at any rate above about 1,000 calls a second.

``--other`` adds a firstbyte whose ``proxy`` package is in DIR (put first on
PYTHONPATH), to compare two versions of the code in one run.

**What is per call and what is per second.** Each process is also counted idle, right after its
calls and a ``SETTLE`` pause not counted (what the calls left to do is theirs, not background),
for as long as its calls took (a second callgrind part, ``callgrind_control --dump`` between the
two). Under callgrind a call is about 100 times slower, so whatever a process does per
second of wall clock (the fleet link's heartbeat and its read-back, measuring claims, timers) falls
on 100 times fewer calls than at full speed. The tables print the raw figure, the idle background
per second of wall clock (in its own right: it is what an idle instance spends), and the per-call
figure with that background subtracted; the last is what a per-request goal is read on (the
background per second is a cost too, reported beside it, not per call). ``--redis`` adds
``NAME-fleet`` for every version (this code and each ``--other``), each measured right after the
same code without Redis, so a pair shares the machine's state of the moment, and prints the stream
entries each wrote while its calls were counted (per call and per second: one a tick, every second,
plus one per urgent event, whatever the calls; docs/adr/0016).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # the process helpers are shared with scripts/bench

SETTLE = 2.0  # seconds between the counted calls and the counted idle, not counted
WARM_SETTLE = 6.0  # after the warm-up, before counting: a fleet's cold start (claims on every route for 5 s) is over

SEEING = ("firstbyte-traces", "firstbyte-status", "firstbyte-see")


def callgrind(args: list[str], out: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}", *args],
        env=env, stdout=subprocess.DEVNULL, stderr=log.open("w"), cwd=bench.ROOT)


def total_instructions(path: Path) -> int:
    """The instructions of one callgrind part (one dump file)."""
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith(("totals:", "summary:")):
            total = max(total, int(line.split()[1]))
    return total


def control(pid: int, *args: str) -> float:
    """callgrind_control; returns when it came back (monotonic)."""
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)
    return time.monotonic()


class Counted(NamedTuple):
    per_call: float  # instructions per call, raw
    idle: float  # instructions per second of wall clock, idle, right after the calls
    net: float  # per call less the idle background of the calls' wall time
    secs: float  # the calls' wall time (counted)
    entries: int | None = None  # fleet stream entries written while the calls were counted


def measure(name: str, args: list[str], env: dict[str, str], port: int, gen: bench.Loadgen, tmp: Path,
            stream: bool, calls: int, seen: dict[str, int] | None = None,
            entries: Callable[[], int] | None = None) -> Counted:
    """Instructions per call, raw and less the idle background; ``seen``: the sink's and poller's
    counts, whose counted window's share is printed; ``entries``: the fleet stream's length."""
    out = tmp / f"callgrind-{name}-{'stream' if stream else 'buffer'}.out"
    proc = callgrind(args, out, env, tmp / f"{name}.log")
    try:
        bench.wait_port(port, proc, timeout=300)  # valgrind on a busy box starts slowly
        url = f"http://127.0.0.1:{port}{bench.PATH}"
        body = dict(bench.BODY, model="one", stream=stream)
        run = {"op": "run", "url": url, "body": body, "stream": stream, "concurrency": 16, "warmup": 0}
        gen.call({**run, "requests": 200})
        time.sleep(WARM_SETTLE)  # the same for every version: what is counted is the steady state
        before, length = dict(seen or {}), entries() if entries else 0
        start = control(proc.pid, "-i", "on")
        gen.call({**run, "requests": calls})
        secs = time.monotonic() - start
        control(proc.pid, "-i", "off")
        written = entries() - length if entries else None
        if seen is not None:
            window = {k: v - before[k] for k, v in seen.items()}
            print(f"{name} {'streamed' if stream else 'buffered'}, in the counted window: {window}", file=sys.stderr)
        control(proc.pid, "--dump")  # part 1: the calls; the counters start again from zero
        time.sleep(SETTLE)  # what the calls left to do (an access log's flush, closing connections) is theirs
        start = control(proc.pid, "-i", "on")
        time.sleep(secs)
        idle_secs = time.monotonic() - start
        control(proc.pid, "-i", "off")
    finally:
        proc.terminate()
        proc.wait(60)
    counted, idle = total_instructions(out.with_name(out.name + ".1")), total_instructions(out)
    per_sec = idle / idle_secs
    return Counted(counted / calls, per_sec, (counted - per_sec * secs) / calls, secs, written)


def main() -> int:
    p = argparse.ArgumentParser(description="instructions per relayed call, firstbyte vs the floor")
    p.add_argument("--calls", type=int, default=300, help="calls counted per measurement")
    p.add_argument("--redis", default=None, metavar="URL",
                   help="add firstbyte-fleet: this code with state.redis at URL (its link's own work counted)")
    p.add_argument("--other", nargs="*", default=[], metavar="NAME=DIR",
                   help="another firstbyte whose proxy package is in DIR")
    p.add_argument("--see", action="store_true", help="add firstbyte-see: tracing on and the status page polled, "
                   "firstbyte-traces: tracing on alone, and firstbyte-status: the page polled alone")
    p.add_argument("--see-sample", type=float, default=1.0, help="tracing.sample for the --see versions")
    p.add_argument("--see-every", type=float, default=None, metavar="SECONDS",
                   help="tracing.export_every for the --see versions (60: only full batches are posted)")
    p.add_argument("--unhedged", nargs="*", default=[], metavar="NAME",
                   help="versions whose routes leave out hedge (code from before it knows no such key); "
                        "'firstbyte-unhedged' adds this code without it")
    args = p.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("scripts/instructions needs valgrind (apt-get install valgrind)", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="firstbyte-instr-"))
    client = redis.Redis.from_url(args.redis) if args.redis else None
    procs = bench.Procs(tmp)
    gen: bench.Loadgen | None = None
    rows: dict[str, dict[str, Counted]] = {}
    try:
        sim = bench.free_port()
        bench.simulate(procs, "sim", sim, 2.0, 0, 8)
        gen = bench.Loadgen()
        versions: dict[str, str | None] = {}
        for name, path in {"firstbyte": None, **dict(o.split("=", 1) for o in args.other)}.items():
            versions[name] = path
            if args.redis:  # right after the same code alone: each pair shares the moment's machine
                versions[f"{name}-fleet"] = path
        if "firstbyte-unhedged" in args.unhedged:
            versions["firstbyte-unhedged"] = None
        if args.see:
            versions["firstbyte-traces"] = None
            versions["firstbyte-status"] = None
            versions["firstbyte-see"] = None
        for stream in (False, True):
            kind = "streamed" if stream else "buffered"
            port = bench.free_port()
            floor = [sys.executable, str(bench.ROOT / "scripts" / "floor.py"), "--port", str(port),
                     "--upstream", f"http://127.0.0.1:{sim}"]
            rows.setdefault("floor", {})[kind] = measure("floor", floor, dict(os.environ), port, gen, tmp,
                                                         stream, args.calls)
            for name, path in versions.items():
                port = bench.free_port()
                config_path = tmp / f"{name}.json"  # JSON is YAML
                seeing = bench.Seeing() if name in SEEING else None
                traced = seeing is not None and name != "firstbyte-status"
                config = bench.firstbyte_config(port, sim, seeing.otlp if traced and seeing else None,
                                                args.see_sample, args.see_every)
                if name in args.unhedged:
                    for route in config["routes"].values():
                        route.pop("hedge")
                entries: Callable[[], int] | None = None
                if name.endswith("-fleet") and client is not None:
                    config["state"] = {"redis": args.redis, "fleet": f"instructions-{port}"}
                    entries = functools.partial(client.xlen, f"firstbyte:instructions-{port}:events")
                config_path.write_text(json.dumps(config))
                env = dict(os.environ, **({"PYTHONPATH": path} if path else {}))
                cmd = [sys.executable, str(bench.BIN / "firstbyte"), "serve", "--config", str(config_path)]
                if seeing is not None:
                    seeing.watch(port, poll=name != "firstbyte-traces")
                try:
                    rows.setdefault(name, {})[kind] = measure(name, cmd, env, port, gen, tmp, stream, args.calls,
                                                              seeing.seen if seeing else None, entries)
                finally:
                    if seeing is not None:
                        seeing.close()
    finally:
        if gen is not None:
            gen.close()
        procs.stop_all()
    report(rows, args.calls)
    return 0


def report(rows: dict[str, dict[str, Counted]], calls: int) -> None:
    """Three tables: raw per call, the idle background per second, per call less it; and each
    ``-fleet`` version against the same code without Redis."""
    print(f"instructions per call (callgrind, {calls} calls at concurrency 16, thousands), raw\n")
    table(rows, lambda c: c.per_call, "x floor")
    print(f"\nidle background, thousands of instructions per second of wall clock (counted {SETTLE:g} s after the"
          "\ncalls, as long as they took; seconds of the counted calls in brackets)\n")
    print(f"{'':<22}{'buffered':>10}{'streamed':>19}")
    for name, row in rows.items():
        b, s = row["buffered"], row["streamed"]
        print(f"{name:<22}{b.idle / 1000:>10.0f} ({b.secs:4.1f}s){s.idle / 1000:>10.0f} ({s.secs:4.1f}s)")
    print("\ninstructions per call less the idle background of the calls' wall time (thousands):"
          "\nwhat a per-request goal is read on\n")
    table(rows, lambda c: c.net, "x floor")
    fleets = [n for n in rows if n.endswith("-fleet") and n[:-6] in rows]
    if fleets:
        print("\nwith Redis / without, per call: raw buffered, streamed; less the idle background buffered, streamed\n")
        for name in fleets:
            f, a = rows[name], rows[name[:-6]]
            ratios = [f[k].per_call / a[k].per_call for k in ("buffered", "streamed")]
            ratios += [f[k].net / a[k].net for k in ("buffered", "streamed")]
            print(f"{name:<22}" + "".join(f"{r - 1:>+9.1%}" for r in ratios))
        print("\nfleet stream entries written while the calls were counted, per call (per second): each is an XADD"
              "\nand an XREAD of it back; one a tick (every second) and one per urgent event, whatever the calls"
              "\n(before docs/adr/0016's \"one entry a tick\": one per 50 ms send gap, or per call when idle)\n")
        for name in fleets:
            print(f"{name:<22}" + "".join(f"{c.entries / calls:>9.2f} ({c.entries / c.secs:4.1f}/s)"
                                          for c in rows[name].values() if c.entries is not None))


def table(rows: dict[str, dict[str, Counted]], value: Callable[[Counted], float], ratio: str) -> None:
    print(f"{'':<22}{'buffered':>10}{ratio:>9}{'streamed':>10}{ratio:>9}")
    floor = rows["floor"]
    for name, row in rows.items():
        b, s = value(row["buffered"]), value(row["streamed"])
        print(f"{name:<22}{b / 1000:>10.0f}{b / value(floor['buffered']):>9.2f}"
              f"{s / 1000:>10.0f}{s / value(floor['streamed']):>9.2f}")


if __name__ == "__main__":
    sys.exit(main())
