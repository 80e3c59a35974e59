"""scripts/simulate-pool's report: a chart per scenario, the table, the goals, and ``--summarise``
(median and range over several runs' JSON)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import orjson
from pool_schedule import (
    DUP_GOAL,
    GOAL,
    HEDGE_OFF,
    HEDGE_ON,
    NAMES,
    ORACLE,
    OUT,
    RACE_GOAL,
    STALL_P99_GOAL,
    STRATEGIES,
    expected_ms,
    knobs_at,
)


def chart(name: str, scenario: dict[str, Any], runs: dict[str, dict[str, Any]], span: float, tag: str = "") -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"A": "tab:blue", "B": "tab:orange", "C": "tab:green"}
    fig, axes = plt.subplots(1 + len(runs), 1, figsize=(10, 2.2 * (1 + len(runs))), sharex=True)
    ax = axes[0]
    t_end = max(c["t"] for r in runs.values() for c in r["calls"])
    grid = [i * t_end / 200 for i in range(201)]
    shown = [r for r in (HEDGE_OFF, HEDGE_ON) if r in runs] or [next(r for r in runs if r != ORACLE)]
    offsets = runs[shown[0]]["offsets"]
    for n in NAMES:
        ax.plot(grid, [expected_ms(knobs_at(scenario[n], t + offsets[n], span)) for t in grid], "--",
                color=colors[n], lw=1, label=f"{n} scheduled")
        for run_name, style in zip(shown, ("-", ":"), strict=False):
            figs = runs[run_name]["figures"]
            pts = [(f["t"], f[n] * 1000) for f in figs if f.get(n) is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), style, color=colors[n], lw=1.5, label=f"{n} figure ({run_name})")
        failing = [t for t in grid if knobs_at(scenario[n], t + offsets[n], span)["fail_rate"] > 0]
        if failing:
            ax.axvspan(min(failing), max(failing), color=colors[n], alpha=0.08, label=f"{n} failing")
    ax.set_ylabel("first chunk ms")
    ax.set_title(f"{name}: scheduled (expected) latency and firstbyte's figure ({', '.join(shown)})")
    ax.legend(fontsize=7, ncol=4, loc="upper right")
    for ax, (strategy, run) in zip(axes[1:], runs.items(), strict=True):
        bins = 40
        width = t_end / bins
        shares: dict[str, list[float]] = {n: [] for n in NAMES}
        xs = []
        for b in range(bins):  # a bin after this run's last call (runs end a little apart) is left out
            inside = [c for c in run["calls"] if b * width <= c["t"] < (b + 1) * width and c.get("ok")]
            if inside:
                xs.append((b + 0.5) * width)
                for n in NAMES:
                    shares[n].append(sum(c.get("served") == n for c in inside) / len(inside))
        ax.stackplot(xs, *(shares[n] for n in NAMES), colors=[colors[n] for n in NAMES], labels=NAMES, alpha=0.8)
        s = run["summary"]
        ax.set_ylabel("share")
        ax.set_ylim(0, 1)
        ax.set_title(f"{strategy}: mean {s['mean_ms']:.1f} ms = x{s['vs_oracle']:.2f} the measured oracle, "
                     f"p99 x{s['p99_vs_oracle']:.2f}, duplicate calls {s['dup_share'] * 100:.1f} %", fontsize=9)
    axes[-1].set_xlabel("seconds since load began")
    axes[1].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    path = OUT / f"simulate-pool{tag}-{name}.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def spread(values: list[float], spec: str) -> str:
    """The median of runs and, when there are several, their range."""
    if not values:
        return "-"
    mid = format(statistics.median(values), spec)
    return mid if len(values) == 1 else f"{mid} [{format(min(values), spec)}-{format(max(values), spec)}]"


def summarise_runs(paths: list[str]) -> int:
    """``--summarise A.json B.json…``: per scenario and run, the median and range over the files of the
    mean and p99 ratios, x choice, duplicate share and follow; the cold-start flood of each file."""
    files = [orjson.loads(Path(path).read_bytes()) for path in paths]
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for data in files:
        for scenario, res in data["results"].items():
            for strategy, s in res["runs"].items():
                rows.setdefault((scenario, strategy), []).append(s)
    print(f"{len(files)} runs: median [range]")
    print("| scenario | run | x oracle mean | x oracle p99 | x choice | duplicate calls % (sim %) | follow "
          "| cold A/B/C |")
    print("|---|---|---|---|---|---|---|---|")
    for (scenario, strategy), runs in rows.items():
        if strategy == ORACLE:
            continue
        choice = [s["choice_vs_sched"] for s in runs if s["choice_vs_sched"] is not None]
        follow = [s["follow_requests"] for s in runs if s["follow_requests"] is not None]
        cold = ", ".join("/".join(str(s["cold_flood"][n]) for n in NAMES) for s in runs)
        dup = (f"{spread([s['dup_share'] * 100 for s in runs], '.1f')} "
               f"({spread([s['sim_dup_share'] * 100 for s in runs], '.1f')})")
        print(f"| {scenario} | {strategy} | {spread([s['vs_oracle'] for s in runs], '.2f')} | "
              f"{spread([s['p99_vs_oracle'] for s in runs], '.2f')} | {spread(choice, '.2f')} | {dup} | "
              f"{spread(follow, '.0f')} | {cold} |")
    return 0



def print_table(results: dict[str, Any], explore: float, alpha: float, hedge: dict[str, Any]) -> None:
    """The run's table, one row per scenario and strategy, with what each column means."""
    print(f"\nsimulate-pool — 3 simulated upstreams over HTTP, streamed calls, fastest: explore {explore:g}, "
          f"alpha {alpha:g}; hedge runs: after {hedge['after']}, max_extra {hedge['max_extra']:g}, "
          f"refresh {hedge['refresh']:g} s; time to first chunk at the client (includes the proxy)")
    print("  oracle    the measured oracle: the same upstreams and firstbyte, every request pinned to the "
          "scheduled-best healthy target (by expected time: a stall share counts at its mean; under load, "
          "counting the oracle's own calls waiting there)")
    print("  x oracle  mean / the measured oracle's mean: the routing alone (the goal)")
    print("  x sched   mean / the scheduled first_chunk_ms of the best target: routing plus the proxy's and "
          "HTTP's own cost")
    print("  x choice  the served target's scheduled first_chunk_ms / the best's: the routing by the schedule alone, "
          "free of CPU noise (a hedge counts from the request's start: its delay plus its target's time; a "
          "stalled call its stall; failed attempts not counted; under load the calls still waiting at the target, "
          "reconstructed from the client's records, over the oracle's expected time)")
    print("  p95 x, p99 x  p95, p99 / the measured oracle's;  on best: share of requests served by the scheduled best")
    print("  dup       duplicate upstream calls per request, by race= (sim: by the simulators' served counts)")
    print("  cold      calls each simulator (A/B/C) had begun when its first first chunk went out: the cold "
          "start's flood")
    print("  follow    requests after the shift until 16 of 20 in a row went to the new best\n")
    head = (f"{'scenario':<21}{'run':<19}{'c':>3}{'reqs':>6}{'err':>4}{'mean ms':>8}{'p99 ms':>8}{'x oracle':>9}"
            f"{'x sched':>8}{'x choice':>9}{'p95 x':>6}{'p99 x':>7}{'on best':>8}{'share A/B/C':>12}"
            f"{'dup %':>6}{'sim %':>6}{'cold':>9}{'follow':>7}")
    print(head)
    print("-" * len(head))
    for scenario, res in results.items():
        for strategy, s in res["runs"].items():
            share = "/".join(f"{s['share'][n] * 100:.0f}" for n in NAMES)
            cold = "/".join(str(s["cold_flood"][n]) for n in NAMES)
            print(f"{scenario:<21}{strategy:<19}{res['concurrency']:>3}{s['requests']:>6}{s['errors']:>4}"
                  f"{s['mean_ms']:>8.1f}{s['p99_ms']:>8.1f}{s['vs_oracle']:>9.2f}{s['vs_sched']:>8.2f}"
                  f"{fmt(s['choice_vs_sched'], '.2f'):>9}{s['p95_vs_oracle']:>6.2f}{s['p99_vs_oracle']:>7.2f}"
                  f"{s['on_oracle'] * 100:>7.0f}%{share:>12}{s['dup_share'] * 100:>6.1f}"
                  f"{s['sim_dup_share'] * 100:>6.1f}{cold:>9}{fmt(s['follow_requests'], 'd'):>7}")


def print_goals(results: dict[str, Any]) -> None:
    """Each ``fastest`` run against its goal: MET, or what missed."""
    print(f"\ngoals: fastest within x{GOAL} of the measured oracle's mean in every scenario (issue 6); "
          f"with hedge on (issue 13): within x{RACE_GOAL}, at most {DUP_GOAL * 100:.0f} % duplicate calls, "
          f"stall p99 within x{STALL_P99_GOAL} of the oracle's")
    for scenario, res in results.items():
        for strategy, s in res["runs"].items():
            if not strategy.startswith("fastest"):
                continue
            hedged = STRATEGIES[strategy].get("hedge", False) is not False
            goal = RACE_GOAL if hedged else GOAL
            missed = []
            if s["vs_oracle"] > goal:
                missed.append(f"mean x{s['vs_oracle']:.2f} > x{goal}")
            if hedged and s["dup_share"] > DUP_GOAL:
                missed.append(f"duplicates {s['dup_share'] * 100:.1f} %")
            if hedged and scenario == "stall" and s["p99_vs_oracle"] > STALL_P99_GOAL:
                missed.append(f"p99 x{s['p99_vs_oracle']:.2f}")
            print(f"  {scenario:<21}{strategy:<19}x{s['vs_oracle']:.2f}  p99 x{s['p99_vs_oracle']:.2f}  "
                  f"dup {s['dup_share'] * 100:.1f} %  {'MET' if not missed else 'MISSED: ' + ', '.join(missed)}"
                  f"  (x{fmt(s['choice_vs_sched'], '.2f')} choice"
                  + ("; repeats " + " ".join(f"x{r:.2f}" for r in s["repeats_vs_oracle"])
                     if "repeats_vs_oracle" in s else "") + ")")


def print_results(results: dict[str, Any], explore: float, alpha: float, hedge: dict[str, Any]) -> None:
    print_table(results, explore, alpha, hedge)
    print_goals(results)
