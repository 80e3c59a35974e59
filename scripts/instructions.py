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
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # the process helpers are shared with scripts/bench

SEEING = ("firstbyte-traces", "firstbyte-status", "firstbyte-see")


def callgrind(args: list[str], out: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}", *args],
        env=env, stdout=subprocess.DEVNULL, stderr=log.open("w"), cwd=bench.ROOT)


def total_instructions(out: Path) -> int:
    total = 0
    for path in out.parent.glob(out.name + "*"):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith(("totals:", "summary:")):
                total = max(total, int(line.split()[1]))
    return total


def measure(name: str, args: list[str], env: dict[str, str], port: int, gen: bench.Loadgen, tmp: Path,
            stream: bool, calls: int, seen: dict[str, int] | None = None) -> float:
    """Instructions per call; ``seen``: the sink's and poller's counts, whose counted window's share
    is printed."""
    out = tmp / f"callgrind-{name}-{'stream' if stream else 'buffer'}.out"
    proc = callgrind(args, out, env, tmp / f"{name}.log")
    try:
        bench.wait_port(port, proc, timeout=300)  # valgrind on a busy box starts slowly
        url = f"http://127.0.0.1:{port}{bench.PATH}"
        body = dict(bench.BODY, model="one", stream=stream)
        run = {"op": "run", "url": url, "body": body, "stream": stream, "concurrency": 16, "warmup": 0}
        gen.call({**run, "requests": 200})
        before = dict(seen or {})
        subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True, capture_output=True)
        gen.call({**run, "requests": calls})
        subprocess.run(["callgrind_control", "-i", "off", str(proc.pid)], check=True, capture_output=True)
        if seen is not None:
            window = {k: v - before[k] for k, v in seen.items()}
            print(f"{name} {'streamed' if stream else 'buffered'}, in the counted window: {window}", file=sys.stderr)
    finally:
        proc.terminate()
        proc.wait(60)
    return total_instructions(out) / calls


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
    procs = bench.Procs(tmp)
    gen: bench.Loadgen | None = None
    rows: dict[str, dict[str, float]] = {}
    try:
        sim = bench.free_port()
        bench.simulate(procs, "sim", sim, 2.0, 0, 8)
        gen = bench.Loadgen()
        versions: dict[str, str | None] = {"firstbyte": None, **dict(o.split("=", 1) for o in args.other)}
        if "firstbyte-unhedged" in args.unhedged:
            versions["firstbyte-unhedged"] = None
        if args.redis:
            versions["firstbyte-fleet"] = None
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
                if name == "firstbyte-fleet":
                    config["state"] = {"redis": args.redis, "fleet": f"instructions-{port}"}
                config_path.write_text(json.dumps(config))
                env = dict(os.environ, **({"PYTHONPATH": path} if path else {}))
                cmd = [sys.executable, str(bench.BIN / "firstbyte"), "serve", "--config", str(config_path)]
                if seeing is not None:
                    seeing.watch(port, poll=name != "firstbyte-traces")
                try:
                    rows.setdefault(name, {})[kind] = measure(name, cmd, env, port, gen, tmp, stream, args.calls,
                                                              seeing.seen if seeing else None)
                finally:
                    if seeing is not None:
                        seeing.close()
    finally:
        if gen is not None:
            gen.close()
        procs.stop_all()
    print(f"instructions per call (callgrind, {args.calls} calls at concurrency 16, thousands)\n")
    print(f"{'':<18}{'buffered':>10}{'x floor':>9}{'streamed':>10}{'x floor':>9}")
    for name, row in rows.items():
        b, s = row["buffered"], row["streamed"]
        print(f"{name:<18}{b / 1000:>10.0f}{b / rows['floor']['buffered']:>9.2f}"
              f"{s / 1000:>10.0f}{s / rows['floor']['streamed']:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
