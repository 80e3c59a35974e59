"""The ``firstbyte`` command: serve, check, explain, simulate, decisions.

A mistake on the command line or in the environment (a busy port, a missing
ledger, a bad ``--since``) ends the command with one line on stderr, not a
traceback: :class:`CliError` carries that line to :func:`main`.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import os
import sqlite3
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from . import __version__
from .config import Config, Route, Simulate, load_config, split_listen
from .config.document import read_yaml
from .config.fields import default, listen_problem
from .errors import ConfigError
from .routing.eligibility import hard_reason


class CliError(Exception):
    """A command that cannot go on: its message is the one line the user sees."""


def _cannot_listen(command: str, listen: str, exc: OSError, flag: str) -> CliError:
    if exc.errno == errno.EADDRINUSE or "address already in use" in str(exc).lower():
        return CliError(f"firstbyte {command}: cannot listen on {listen}: the address is already in use "
                        f"(another firstbyte? pick another with {flag})")
    if exc.errno == errno.EACCES:
        return CliError(f"firstbyte {command}: cannot listen on {listen}: permission denied "
                        "(ports below 1024 need privileges)")
    return CliError(f"firstbyte {command}: cannot start: {exc.strerror or exc}")


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def describe(config: Config) -> str:
    """The plan `firstbyte check` prints: each route's targets and what load-time filters say."""
    from .config.advice import limit_advice

    workers = f" with {config.workers} workers" if config.workers > 1 else ""
    out = [f"config {config.source}: valid; listen {config.listen}{workers}"]
    out += [f"warning: {line}" for line in limit_advice(config, config.workers)]
    for route in config.routes.values():
        out.append("")
        out.append(f"route {route.name}  strategy={route.strategy}  {races(route)}")
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


def races(route: Route) -> str:
    """Whether a route races for the first token, and on what terms (``hedge:``, docs/routing.md)."""
    hedge = route.hedge
    if hedge is None:
        return "races: no" + (" (hedge: false)" if route.strategy == "fastest" else " (no hedge: set)")
    after = f"p{hedge.after_percentile}" if hedge.after_secs is None else f"{hedge.after_secs:g}s"
    return (f"races: after {after}, max_extra {hedge.max_extra:g}, explore {'on' if hedge.explore else 'off'}, "
            f"refresh {hedge.refresh_secs:g}s, cap {hedge.cap:g}")


def _load(args: argparse.Namespace) -> Config | None:
    """The config ``--config`` names, or None once its problems are on stderr."""
    try:
        return load_config(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
    except Exception as exc:  # a bug in reading the file: still one line naming the file, never a traceback
        print(f"{args.config}: could not be read: {type(exc).__name__}: {exc} (a firstbyte bug: "
              "please report it with the file)", file=sys.stderr)
    return None


def cmd_check(args: argparse.Namespace) -> int:
    config = _load(args)
    if config is None:
        return 1
    print(describe(config))
    return 0


def _workers(args: argparse.Namespace, config: Config) -> int:
    """How many workers: ``--workers`` over the file's ``workers``; checked like the file."""
    from .config.workers import needs_redis, parse_workers

    if args.workers is None:
        return config.workers
    count = parse_workers(args.workers)
    if isinstance(count, str):
        raise CliError(f"firstbyte serve: --workers: {count}")
    if count > 1 and config.state.redis is None:
        raise CliError(f"firstbyte serve: --workers: {needs_redis(count)}")
    return count


def cmd_serve(args: argparse.Namespace) -> int:
    from .box import Box
    from .service import Service, run
    from .supervisor import PARENT_ENV, Supervisor, follow_parent

    if args.worker is not None and PARENT_ENV in os.environ:
        follow_parent(int(os.environ[PARENT_ENV]))
    if args.listen is not None and (problem := listen_problem(args.listen)) is not None:
        raise CliError(f"firstbyte serve: --listen: {problem}")
    config = _load(args)
    if config is None:
        return 1
    workers = 1 if args.worker is not None else _workers(args, config)

    async def main() -> int:
        box = Box.from_env(args.worker) if args.worker is not None else None
        return await Service(args.config, config, args.listen, box).serve()

    try:
        if workers > 1:  # plain asyncio and no threads: its workers are forked (proxy/forked.py)
            return asyncio.run(Supervisor(args.config, config, args.listen, workers, args.log_level).serve())
        return run(main)
    except OSError as exc:
        raise _cannot_listen("serve", args.listen or config.listen, exc, "--listen or the file's listen") from None


def _mode_cells(figures: dict[str, Any]) -> list[str]:
    figure = figures["figure_s"]
    return ["-" if figure is None else f"{figure:.3f}s", str(figures["samples"])]


def _gateway_url(args: argparse.Namespace) -> str | None:
    """``--url``, else the ``ops_listen`` of ``--config`` when it has one (explain is served there
    without client keys), else its ``listen`` (a wildcard host asked on loopback), else the default.
    Only these are read: the file's secrets (client and provider keys) need not be in this shell."""
    if args.url is not None:
        return str(args.url)
    if args.config is None:
        return "http://127.0.0.1:8080"
    try:
        data = read_yaml(Path(args.config).read_text("utf-8"), str(args.config))
        listen = None
        if isinstance(data, dict):
            listen = data.get("ops_listen") or data.get("listen", default(Config, "listen"))
        if not isinstance(listen, str):
            raise ValueError(listen)
        host, port = split_listen(listen)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return None
    except (OSError, UnicodeDecodeError, ValueError):
        print(f"{args.config}: listen (or ops_listen): not host:port", file=sys.stderr)
        return None
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _fleet_words(data: dict[str, Any]) -> str:
    """``  fleet=NAME in-fleet since ...`` (or alone, with why), then ``  worker I of N`` for a box of
    workers; nothing without state.redis."""
    fleet, box = data.get("fleet"), data.get("box")
    if not fleet or fleet.get("state") == "off":
        return ""
    words = f"  fleet={fleet['fleet']} {fleet['state']} since {fleet['since']} as {fleet['instance']}"
    words += f" ({fleet['reason']})" if fleet.get("reason") else ""
    return words + (f"  worker {box['worker']} of {box['workers']}" if box else "")


def _last_words(last: dict[str, Any]) -> str:
    """``figure streamed sample by INSTANCE at TIME; breaker opened by ...``: which instance's event
    last changed each (printed in a fleet only)."""
    parts = []
    for part in ("figure", "breaker"):
        seen = last.get(part)
        if seen:
            parts.append(f"{part} {seen['what']} by {seen['by']} at {seen['at']}")
    return "; ".join(parts)


def cmd_explain(args: argparse.Namespace) -> int:
    base = _gateway_url(args)
    if base is None:
        return 1
    url = f"{base.rstrip('/')}/v1/routes/{args.route}/explain?mode={args.mode}"
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
    print(f"route {data['route']}  strategy={data['strategy']}  mode={data['mode']}{_fleet_words(data)}")
    rows = [
        [str(i + 1), o["target"], o["detail"], *_mode_cells(o["streamed"]), *_mode_cells(o["buffered"])]
        for i, o in enumerate(data["order"])
    ]
    print(_table(rows, ["#", "target", "why", "streamed", "samples", "buffered", "samples"]))
    for e in data["excluded"]:
        print(f"excluded {e['target']}: {e['reason']}")
    in_fleet = (data.get("fleet") or {}).get("state", "off") != "off"
    for o in [*data["order"], *data["excluded"]] if in_fleet else ():  # alone there is only this one
        words = _last_words(o.get("last") or {})
        if words:
            print(f"last {o['target']}: {words}")
    hedge = data.get("hedge")
    if hedge is not None:
        print(_hedge_line(hedge))
    return 0


def _hedge_line(hedge: dict[str, Any]) -> str:
    if hedge["leader"] is None:
        when = "no eligible target"
    elif hedge["learner"] is not None:
        when = (f"{hedge['learner']} is to be measured beside {hedge['leader']}, free the first time, "
                "else on the budget: no timed hedge then")
    elif hedge["delay_s"] is None:
        when = f"too few samples of {hedge['leader']} to hedge by time"
    else:
        when = f"now {hedge['delay_s']:.3f}s on {hedge['leader']}"
    return (f"hedge after {hedge['after']} ({when}); budget {hedge['budget_tokens']:.2f} "
            f"tokens, {hedge['budget_refused']} refused, max_extra {hedge['max_extra']:g}; "
            f"explore {'on' if hedge['explore'] else 'off'}, refresh {hedge['refresh_s']:g}s, cap {hedge['cap']:g}x")


def cmd_simulate(args: argparse.Namespace) -> int:
    from .service import run
    from .sim.server import serve_simulator

    try:
        return run(lambda: serve_simulator(args))  # uvloop, like serve: benchmarks share its cost
    except OSError as exc:
        raise _cannot_listen("simulate", f"{args.host}:{args.port}", exc, "--port") from None


def cmd_decisions(args: argparse.Namespace) -> int:
    from .observe.ledger_read import format_summary, summarise

    since = _duration(args.since) if args.since else None
    import time

    if not os.path.exists(args.ledger):
        raise CliError(f"firstbyte decisions: no ledger at {args.ledger} (pass --ledger PATH: the "
                       "file routes.yaml names in ledger.path)")
    try:
        summary = summarise(args.ledger, args.route, since, time.time())
    except sqlite3.Error as exc:
        raise CliError(f"firstbyte decisions: cannot read {args.ledger}: {exc}") from None
    print(format_summary(summary))
    return 0


def _duration(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        value = float(text[:-1]) * units[text[-1]] if text[-1:] in units else float(text)
    except ValueError:
        raise CliError(f"firstbyte decisions: --since {text!r} is not a duration "
                       "(seconds, or a number with s, m, h or d: 90, 30m, 1h, 2d)") from None
    if value < 0:
        raise CliError(f"firstbyte decisions: --since {text!r} is negative")
    return value


def add_sim_knobs(p: argparse.ArgumentParser) -> None:
    d = Simulate()  # the defaults are the model's, written once
    p.add_argument("--first-chunk-ms", type=float, default=d.first_chunk_ms, help="mean time to the first chunk")
    p.add_argument("--jitter-ms", type=float, default=d.jitter_ms, help="uniform +/- jitter on the first chunk")
    p.add_argument("--chunk-ms", type=float, default=d.chunk_ms, help="time between chunks of a stream")
    p.add_argument("--chunks", type=int, default=d.chunks, help="tokens (chunks) per answer")
    p.add_argument("--fail-rate", type=float, default=d.fail_rate, help="share of calls answered with --fail-status")
    p.add_argument("--fail-status", type=int, default=d.fail_status, help="HTTP status of a simulated failure")
    p.add_argument("--seed", type=int, default=d.seed, help="random seed for jitter and failures")
    p.add_argument("--stall-rate", type=float, default=d.stall_rate, help="share of calls whose first chunk stalls")
    p.add_argument("--stall-ms", type=float, default=d.stall_ms, help="how much longer a stalled first chunk waits")
    p.add_argument("--load-ms", type=float, default=d.load_ms,
                   help="first chunk waits this much more per earlier call still waiting for its own")


class _Help(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Each option's default in its help; descriptions keep their line breaks."""


def _command(sub: Any, name: str, summary: str, description: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=summary, description=f"{summary}.\n\n{description}", formatter_class=_Help)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="firstbyte", description=__doc__, formatter_class=_Help)
    p.add_argument("--version", action="version", version=f"firstbyte {__version__}")
    p.add_argument("--log-level", default="info", help="debug, info, warning or error")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = _command(sub, "serve", "run the gateway",
                 "Serves the routes of the file on its listen address (SIGHUP reloads the file, SIGTERM drains).")
    s.add_argument("--config", default="routes.yaml", help="the routes file")
    s.add_argument("--listen", default=None, help="HOST:PORT; overrides the file's listen")
    s.add_argument("--workers", default=None, help="processes on the listen address (N or auto); overrides "
                   "the file's workers")
    s.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)  # set by the supervisor
    s.set_defaults(fn=cmd_serve)

    c = _command(sub, "check", "validate a routes file and print the plan",
                 "Lists every problem with its path, or each route's targets and whether they are eligible.")
    c.add_argument("--config", default="routes.yaml", help="the routes file")
    c.set_defaults(fn=cmd_check)

    e = _command(sub, "explain", "the order a request to ROUTE would get now",
                 "Asks a running gateway; the same plan() as traffic, without exploring.")
    e.add_argument("route", help="a route name from the file")
    e.add_argument("--url", default=None, help="the running gateway (default: the listen of --config, "
                   "else http://127.0.0.1:8080)")
    e.add_argument("--config", default=None, help="the routes file the gateway runs: its listen is asked")
    e.add_argument("--key", default=None, help="client key, if the gateway asks for one")
    e.add_argument("--mode", choices=("streamed", "buffered"), default="streamed",
                   help="rank by the figures of streamed (first token) or buffered (whole answer) calls")
    e.add_argument("--json", action="store_true", help="print the JSON answer instead of a table")
    e.set_defaults(fn=cmd_explain)

    m = _command(sub, "simulate", "serve the simulated provider over real HTTP",
                 "An OpenAI-compatible stand-in with tunable timing, for benchmarks and trials without keys.")
    m.add_argument("--host", default="127.0.0.1", help="address to listen on")
    m.add_argument("--port", type=int, default=9000, help="port to listen on")
    m.add_argument("--schedule", default=None,
                   help="JSON file: [{\"at\": secs, <knob>: value, ...}, ...] applied over time")
    add_sim_knobs(m)
    m.set_defaults(fn=cmd_simulate)

    d = _command(sub, "decisions", "summarise the decision ledger",
                 "Share served per target, failover rate, exploration share, p50/p95 time to first chunk.")
    d.add_argument("--ledger", default="firstbyte.db", help="the SQLite ledger (ledger.path in routes.yaml)")
    d.add_argument("--route", default=None, help="only this route")
    d.add_argument("--since", default=None, help="only the last: 90 (seconds), 30m, 1h, 2d")
    d.set_defaults(fn=cmd_decisions)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        code = int(args.fn(args))
        sys.stdout.flush()  # here, where a closed pipe can be caught, not at interpreter exit
        return code
    except CliError as exc:
        print(exc, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader left (``firstbyte check | head``): stop quietly, as a command killed by SIGPIPE
        # would. stdout goes to /dev/null so the interpreter's own last flush does not complain.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
