"""The ``firstbyte`` command: serve, check, explain, simulate, decisions."""

from __future__ import annotations

import argparse
import logging
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

import orjson

from .config import Config, load_config
from .errors import ConfigError
from .routing.eligibility import hard_reason


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def describe(config: Config) -> str:
    """The plan `firstbyte check` prints: each route's targets and what load-time filters say."""
    out = [f"config {config.source}: valid; listen {config.listen}"]
    for route in config.routes.values():
        out.append("")
        out.append(f"route {route.name}  strategy={route.strategy}")
        rows = []
        for t in route.targets:
            provider = config.providers[t.provider]
            status = hard_reason(route, t, None, config.providers) or "ok"
            price = "-" if t.price is None else f"{t.price.input:g}/{t.price.output:g}"
            rows.append([
                t.name, provider.kind, t.model, str(t.retry), f"{t.weight:g}",
                "-" if t.quality is None else f"{t.quality:g}",
                "-" if t.context_window is None else str(t.context_window), price, status,
            ])
        header = ["target", "kind", "upstream model", "retry", "weight", "quality", "context",
                  "price in/out", "eligible"]
        out.append(_table(rows, header))
    return "\n".join(out)


def cmd_check(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(describe(config))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from .service import Service, run

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1

    async def main() -> int:
        return await Service(args.config, config, args.listen).serve()

    return run(main)


def _mode_cells(figures: dict[str, Any]) -> list[str]:
    figure = figures["figure_s"]
    return ["-" if figure is None else f"{figure:.3f}s", str(figures["samples"])]


def cmd_explain(args: argparse.Namespace) -> int:
    url = f"{args.url.rstrip('/')}/v1/routes/{args.route}/explain?mode={args.mode}"
    req = urllib.request.Request(url)
    if args.key:
        req.add_header("Authorization", f"Bearer {args.key}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            data = orjson.loads(resp.read())
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            message = orjson.loads(body)["error"]["message"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            message = body.decode("utf-8", "replace")
        print(f"error {exc.code}: {message}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"cannot reach {url}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())
        return 0
    print(f"route {data['route']}  strategy={data['strategy']}  mode={data['mode']}")
    rows = [
        [str(i + 1), o["target"], o["detail"], *_mode_cells(o["streamed"]), *_mode_cells(o["buffered"])]
        for i, o in enumerate(data["order"])
    ]
    print(_table(rows, ["#", "target", "why", "streamed", "samples", "buffered", "samples"]))
    for e in data["excluded"]:
        print(f"excluded {e['target']}: {e['reason']}")
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from .service import run
    from .simserver import serve_simulator

    return run(lambda: serve_simulator(args))  # uvloop, like serve: benchmarks share its cost


def cmd_decisions(args: argparse.Namespace) -> int:
    from .observe.ledger import format_summary, summarise

    since = _duration(args.since) if args.since else None
    import time

    print(format_summary(summarise(args.ledger, args.route, since, time.time())))
    return 0


def _duration(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if text[-1:] in units:
        return float(text[:-1]) * units[text[-1]]
    return float(text)


def add_sim_knobs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--first-chunk-ms", type=float, default=120.0)
    p.add_argument("--jitter-ms", type=float, default=30.0)
    p.add_argument("--chunk-ms", type=float, default=10.0)
    p.add_argument("--chunks", type=int, default=16)
    p.add_argument("--fail-rate", type=float, default=0.0)
    p.add_argument("--fail-status", type=int, default=503)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stall-rate", type=float, default=0.0, help="share of calls whose first chunk stalls")
    p.add_argument("--stall-ms", type=float, default=0.0, help="how much longer a stalled first chunk waits")
    p.add_argument("--load-ms", type=float, default=0.0,
                   help="first chunk waits this much more per earlier call still waiting for its own")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="firstbyte", description=__doc__)
    p.add_argument("--log-level", default="info")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the gateway")
    s.add_argument("--config", default="routes.yaml")
    s.add_argument("--listen", default=None, help="HOST:PORT, overrides the file's listen")
    s.set_defaults(fn=cmd_serve)

    c = sub.add_parser("check", help="validate a routes file and print the plan")
    c.add_argument("--config", default="routes.yaml")
    c.set_defaults(fn=cmd_check)

    e = sub.add_parser("explain", help="the order a request to ROUTE would get now")
    e.add_argument("route")
    e.add_argument("--url", default="http://127.0.0.1:8080")
    e.add_argument("--key", default=None, help="client key, if the gateway asks for one")
    e.add_argument("--mode", choices=("streamed", "buffered"), default="streamed",
                   help="rank by the figures of streamed (first token) or buffered (whole answer) calls")
    e.add_argument("--json", action="store_true")
    e.set_defaults(fn=cmd_explain)

    m = sub.add_parser("simulate", help="serve the simulated provider over real HTTP")
    m.add_argument("--host", default="127.0.0.1")
    m.add_argument("--port", type=int, default=9000)
    m.add_argument("--schedule", default=None,
                   help="JSON file: [{\"at\": secs, <knob>: value, ...}, ...] applied over time")
    add_sim_knobs(m)
    m.set_defaults(fn=cmd_simulate)

    d = sub.add_parser("decisions", help="summarise the decision ledger")
    d.add_argument("--ledger", default="firstbyte.db")
    d.add_argument("--route", default=None)
    d.add_argument("--since", default=None, help="e.g. 30m, 1h, 2d")
    d.set_defaults(fn=cmd_decisions)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(args.fn(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
