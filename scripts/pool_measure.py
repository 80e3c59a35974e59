"""scripts/simulate-pool's measuring: the closed loop of streamed calls, the simulators' own counts,
and one run's figures (means, percentiles, ratios, duplicates, follow)."""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp
import bench
import orjson
from pool_schedule import NAMES, extra_calls, knobs_at, oracle, served_ms

from proxy.routing.decision import parse_header


def sim_command(spec: dict[str, Any], port: int, schedule: Path, seed: int) -> list[str]:
    """``firstbyte simulate`` for one target of a scenario, its steps in ``schedule``."""
    return [str(bench.BIN / "firstbyte"), "simulate", "--port", str(port),
            "--first-chunk-ms", str(spec["first_chunk_ms"]), "--jitter-ms", str(spec.get("jitter_ms", 0)),
            "--chunk-ms", "1", "--chunks", "2", "--fail-rate", str(spec.get("fail_rate", 0.0)),
            "--stall-rate", str(spec.get("stall_rate", 0.0)), "--stall-ms", str(spec.get("stall_ms", 0.0)),
            "--load-ms", str(spec.get("load_ms", 0.0)), "--seed", str(seed), "--schedule", str(schedule)]


def start_all(procs: bench.Procs, commands: dict[str, tuple[list[str], int]], timeout: float = 90.0) -> None:
    """Every process at once, then each port: start-ups overlap; on a busy machine six take a while."""
    started = [(procs.spawn(name, argv), port) for name, (argv, port) in commands.items()]
    for proc, port in started:
        bench.wait_port(port, proc, timeout=timeout)


async def restart(ports: dict[str, int]) -> None:
    """Each simulator's schedule and counts start again now (``POST /sim/restart``): load begins at
    the schedule's start however long the processes took to come up."""
    async with aiohttp.ClientSession() as session:
        for port in ports.values():
            async with session.post(f"http://127.0.0.1:{port}/sim/restart") as resp:
                resp.raise_for_status()


async def sim_offsets(ports: dict[str, int]) -> dict[str, float]:
    """Each simulator's schedule start on this process's monotonic clock."""
    starts = {}
    async with aiohttp.ClientSession() as session:
        for name, port in ports.items():
            t0 = time.monotonic()
            async with session.get(f"http://127.0.0.1:{port}/sim/stats") as resp:
                stats = await resp.json()
            t1 = time.monotonic()
            starts[name] = (t0 + t1) / 2 - stats["elapsed_s"]
    return starts


async def poll(session: aiohttp.ClientSession, health_url: str, until: float, t_load: float,
               figures: list[dict[str, Any]]) -> None:
    """firstbyte's figure for each target, every 0.25 s until ``until`` (for the chart)."""
    while time.monotonic() < until:
        async with session.get(health_url) as resp:
            targets = (await resp.json())["targets"]
        figures.append({"t": time.monotonic() - t_load, **{t["target"]: t["streamed"]["figure_s"] for t in targets}})
        await asyncio.sleep(0.25)


async def load(url: str, concurrency: int, until: float, starts: dict[str, float],
               scenario: dict[str, Any], span: float, health_url: str, pin: bool = False) -> dict[str, Any]:
    """Closed-loop streamed calls until ``until``; every call with its oracle; figures polled.

    With ``pin`` every call carries ``x-route-provider`` naming the scheduled-best target when it
    is sent: the measured oracle."""
    body = orjson.dumps({"model": "pool", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    plain = {"content-type": "application/json"}
    pinned = {n: {**plain, "x-route-provider": n} for n in NAMES}
    calls: list[dict[str, Any]] = []
    figures: list[dict[str, Any]] = []
    loaded = any(scenario[n].get("load_ms") for n in NAMES)
    waiting = {n: 0 for n in NAMES}  # the pinned oracle's calls still waiting for a first chunk, per target
    t_load = time.monotonic()

    async def worker(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < until:
            sent = time.monotonic()
            elapsed = {n: sent - starts[n] for n in NAMES}
            best, best_ms = oracle(scenario, elapsed, span, waiting if pin and loaded else None)
            record: dict[str, Any] = {"t": sent - t_load, "oracle": best, "oracle_ms": best_ms}
            headers = pinned[best] if pin and best in pinned else plain
            if pin and best in waiting:
                waiting[best] += 1
            try:
                async with session.post(url, data=body, headers=headers) as resp:
                    first = await resp.content.readany()
                    record["ttfc_ms"] = (time.monotonic() - sent) * 1000
                    if pin and best in waiting:
                        waiting[best] -= 1
                        best = ""
                    await resp.read()
                    record["ok"] = resp.status == 200 and bool(first)
                    decision = parse_header(resp.headers["x-route-decision"])
                    record["served"] = served = decision.served
                    record["attempts"] = decision.attempts
                    record["race"] = decision.race
                    record["header"] = resp.headers["x-route-decision"]  # kept by --dump-calls
                    record["extra"] = extra_calls(decision.race)
                    if served in NAMES and not loaded:  # this choice's cost by the schedule, without the wire
                        record["served_ms"] = served_ms(knobs_at(scenario[served], elapsed[served], span),
                                                        record["ttfc_ms"], dict(decision.race).get(served, ""))
            except (aiohttp.ClientError, KeyError, ValueError):
                record["ok"] = False
            finally:
                if pin and best in waiting:
                    waiting[best] -= 1
            calls.append(record)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(poll(session, health_url, until, t_load, figures),
                             *(worker(session) for _ in range(concurrency)))
    # Where each simulator was in its schedule when load began: chart and shift times use it.
    return {"calls": calls, "figures": figures, "offsets": {n: t_load - starts[n] for n in NAMES}}


async def sim_stats(ports: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Each simulator's own counts: ``served`` counts every call it began answering (a cancelled racer
    too, a failure not)."""
    out = {}
    async with aiohttp.ClientSession() as session:
        for name, port in ports.items():
            async with session.get(f"http://127.0.0.1:{port}/sim/stats") as resp:
                out[name] = await resp.json()
    return out


def cold_flood(calls: list[dict[str, Any]]) -> dict[str, int]:
    """Per target, how many requests were sent to it (any attempt, a racer's included) before its first
    answer reached the client: the requests a cold start sends a target before it is measured."""
    first: dict[str, float] = {}
    for c in calls:
        for name, detail in c.get("attempts", ()):
            word, _, secs = detail.rpartition(" ")
            if word.isdigit() and word.startswith("2"):
                at = c["t"] + float(secs.rstrip("s"))
                first[name] = min(first.get(name, at), at)
    return {n: sum(1 for c in calls if c["t"] < first.get(n, float("inf"))
                   and any(a == n for a, _ in c.get("attempts", ()))) for n in NAMES}


def follow(calls: list[dict[str, Any]], shift_t: float) -> int | None:
    """Requests after the shift until 80 % of the next 20 went to the new oracle target."""
    after = [c for c in calls if c["t"] >= shift_t and c.get("ok")]
    for i in range(len(after) - 20):
        window = after[i:i + 20]
        if sum(c.get("served") == c["oracle"] for c in window) >= 16:
            return i
    return None


def summarise(calls: list[dict[str, Any]], shift_t: float | None,
              oracle_run: dict[str, Any] | None = None, loaded: bool = False) -> dict[str, Any]:
    """One run's figures; ``oracle_run`` is the measured oracle's summary (None for the oracle itself).

    ``vs_oracle`` is the mean over the measured oracle's mean (the goal); ``vs_sched`` is the mean
    over the scheduled ``first_chunk_ms`` of the best target at each request (it includes the
    proxy's and HTTP's own cost). ``loaded``: ``x choice`` is over the measured oracle's expected
    time (its own calls waiting counted), since a request's best depends on who else is waiting."""
    ok = [c for c in calls if c.get("ok")]
    ttfc = sorted(c["ttfc_ms"] for c in ok)
    sched_mean = statistics.fmean(c["oracle_ms"] for c in ok)
    share = {n: sum(c.get("served") == n for c in ok) / len(ok) for n in NAMES}
    out: dict[str, Any] = {"requests": len(calls), "errors": len(calls) - len(ok),
                           "mean_ms": statistics.fmean(ttfc), "p95_ms": ttfc[int(0.95 * (len(ttfc) - 1))],
                           "p99_ms": ttfc[int(0.99 * (len(ttfc) - 1))],
                           "sched_mean_ms": sched_mean, "share": share,
                           "on_oracle": sum(c.get("served") == c["oracle"] for c in ok) / len(ok)}
    reference = out if oracle_run is None else oracle_run
    out["oracle_mean_ms"] = reference["mean_ms"]
    out["vs_oracle"] = out["mean_ms"] / reference["mean_ms"]
    out["p95_vs_oracle"] = out["p95_ms"] / reference["p95_ms"]
    out["p99_vs_oracle"] = out["p99_ms"] / reference["p99_ms"]
    # Duplicate upstream calls: racers beside the first, by each answer's race= field.
    out["extra_calls"] = sum(c.get("extra", 0) for c in calls)
    out["dup_share"] = out["extra_calls"] / len(calls)
    out["hedged_share"] = sum(any(r.startswith("hedge") for _, r in c.get("race", ())) for c in calls) / len(calls)
    out["raced_share"] = sum(c.get("extra", 0) > 0 for c in calls) / len(calls)
    out["cold_flood"] = cold_flood(calls)  # by the client's view; the simulators' own count replaces it
    out["vs_sched"] = out["mean_ms"] / sched_mean
    chosen = [c["served_ms"] for c in ok if "served_ms" in c]  # a loaded scenario's: loaded_choice
    # The served targets' scheduled first_chunk_ms over the oracle's: the routing's cost by the schedule
    # alone, free of CPU noise (it does not count the time of failed attempts before a failover).
    best = reference["sched_mean_ms"] if loaded else sched_mean
    out["choice_vs_sched"] = statistics.fmean(chosen) / best if chosen else None
    out["follow_requests"] = follow(calls, shift_t) if shift_t is not None else None
    return out


def pooled(reps: list[dict[str, Any]], oracle_summary: dict[str, Any] | None, loaded: bool) -> dict[str, Any]:
    """Several repeats of one run as one: means and percentiles over all their calls (the oracle's
    too, so one lucky or unlucky oracle run cannot decide a ratio), follow as the median of the
    repeats' own (each has its shift), and each repeat's ``x oracle`` against the pooled oracle."""
    calls = [c for r in reps for c in r["calls"]]
    summary = summarise(calls, None, oracle_summary, loaded)
    each = [summarise(r["calls"], r["shift_t"], oracle_summary or summary, loaded) for r in reps]
    follows = [e["follow_requests"] for e in each if e["follow_requests"] is not None]
    summary["follow_requests"] = round(statistics.median(follows)) if follows else None
    summary["repeats_vs_oracle"] = [e["vs_oracle"] for e in each]
    summary["cold_flood"] = each[0]["cold_flood"]
    return {**reps[0], "calls": calls, "summary": summary}

