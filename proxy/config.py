"""routes.yaml: parse once, validate everything, then trust.

``load_config`` reads the file and returns a frozen :class:`Config`, or raises
:class:`ConfigError` listing every problem with its path
(``routes.chat.targets[1].provider: unknown provider 'grok'``). Nothing here opens
sockets or databases; the server builds those from a valid Config. Provider keys
are read from the environment at load time, so a reload picks up a rotated key.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError

KINDS = ("openai", "anthropic", "simulated")
STRATEGIES = ("ordered", "weighted", "fastest", "cheapest", "score")
SIGNALS = ("ewma", "p50")
_NAME = re.compile(r"^[A-Za-z0-9._:/@+\-]+$")

TargetKey = tuple[str, str]  # (provider name, upstream model): the unit figures are kept for


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect: float = 5.0
    first_chunk: float = 30.0
    idle: float = 60.0
    total: float = 600.0


@dataclass(frozen=True, slots=True)
class Simulate:
    """Knobs of the simulated provider; the same ones ``firstbyte simulate`` takes."""

    first_chunk_ms: float = 120.0
    jitter_ms: float = 30.0
    chunk_ms: float = 10.0
    chunks: int = 16
    fail_rate: float = 0.0
    fail_status: int = 503
    seed: int | None = None
    stall_rate: float = 0.0  # this share of calls waits ``stall_ms`` more for its first chunk (a tail)
    stall_ms: float = 0.0
    load_ms: float = 0.0  # the first chunk waits this much more per earlier call still waiting for its own


@dataclass(frozen=True, slots=True)
class Provider:
    name: str
    kind: str
    base_url: str = ""
    api_key_env: str | None = None
    api_key: str | None = field(default=None, repr=False)
    timeouts: Timeouts = Timeouts()
    max_concurrent: int = 0
    queue: int = 0
    simulate: Simulate = Simulate()
    anthropic_version: str = "2023-06-01"
    default_max_tokens: int = 4096

    @property
    def has_credentials(self) -> bool:
        return self.api_key_env is None or bool(self.api_key)


@dataclass(frozen=True, slots=True)
class Price:
    input: float
    output: float

    @property
    def total(self) -> float:
        return self.input + self.output


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    provider: str
    model: str
    retry: int = 0
    weight: float = 1.0
    quality: float | None = None
    context_window: int | None = None
    price: Price | None = None
    key: TargetKey = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Read on every request by the planner and the walker: build the tuple once.
        object.__setattr__(self, "key", (self.provider, self.model))


@dataclass(frozen=True, slots=True)
class Fastest:
    signal: str = "ewma"
    alpha: float = 0.1  # DESIGN.md says 0.3; docs/adr/0006 says why 0.1 with the recovery rule
    window: int = 100
    min_samples: int = 1
    max_age_secs: float = 300.0
    explore: float = 0.03  # DESIGN.md says 0.1; docs/adr/0006
    seed: int | None = None
    quality_weight: float = 0.0
    latency_target_ms: float = 2000.0
    unknown_quality: float = 0.5
    load_aware: bool = False  # rank by figure x (1 + load_weight x requests in flight)
    load_weight: float = 1.0


@dataclass(frozen=True, slots=True)
class Hedge:
    """Race the next target for the first token (docs/adr/0008)."""

    after_secs: float | None = None  # a fixed delay, or
    after_percentile: int | None = 90  # the leading target's own pNN of first-token samples
    max_extra: float = 0.1  # at most this share of the route's requests start a second attempt
    explore: bool = True  # exploring and measuring race the leader instead of replacing it
    refresh_secs: float = 5.0  # under a race, a target not measured for this long is explored


@dataclass(frozen=True, slots=True)
class Cooldown:
    failures: int = 3
    secs: float = 30.0


@dataclass(frozen=True, slots=True)
class ScoreWeights:
    speed: float = 1.0
    cost: float = 1.0
    health: float = 1.0
    quality: float = 1.0


@dataclass(frozen=True, slots=True)
class Route:
    name: str
    strategy: str
    targets: tuple[Target, ...]
    fastest: Fastest = Fastest()
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    min_context_window: int | None = None
    min_quality: float | None = None
    cooldown: Cooldown = Cooldown()
    score: ScoreWeights = ScoreWeights()
    hedge: Hedge | None = None

    def target(self, name: str) -> Target | None:
        for target in self.targets:
            if target.name == name:
                return target
        return None


@dataclass(frozen=True, slots=True)
class AccessLog:
    format: str = "text"
    path: str = "-"


@dataclass(frozen=True, slots=True)
class Ledger:
    path: str | None = None
    retention_days: float = 30.0
    queue: int = 10000


@dataclass(frozen=True, slots=True)
class Clients:
    keys_env: str | None = None
    keys: tuple[str, ...] = field(default=(), repr=False)


@dataclass(frozen=True, slots=True)
class Config:
    listen: str = "127.0.0.1:8080"
    ops_listen: str | None = None
    providers: Mapping[str, Provider] = field(default_factory=dict)
    routes: Mapping[str, Route] = field(default_factory=dict)
    clients: Clients = Clients()
    access_log: AccessLog = AccessLog()
    ledger: Ledger = Ledger()
    max_body_bytes: int = 4 * 1024 * 1024
    shutdown_grace: float = 30.0
    source: str = "<memory>"

    @property
    def host_port(self) -> tuple[str, int]:
        return split_listen(self.listen)

    def target_keys(self) -> set[TargetKey]:
        return {t.key for route in self.routes.values() for t in route.targets}


def split_listen(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


class _Reader:
    """Typed access to a YAML mapping that records problems instead of raising."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems

    def problem(self, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message}")

    def mapping(self, value: Any, path: str, allowed: tuple[str, ...]) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.problem(path, f"expected a mapping, got {type(value).__name__}")
            return {}
        for key in value:
            if key not in allowed:
                self.problem(f"{path}.{key}", f"unknown key (expected one of: {', '.join(allowed)})")
        return value

    def number(
        self,
        data: dict[str, Any],
        key: str,
        path: str,
        default: float | None,
        *,
        low: float | None = None,
        high: float | None = None,
        integer: bool = False,
    ) -> Any:
        value = data.get(key, default)
        if value is None:
            return None
        kind = "a whole number" if integer else "a number"
        if isinstance(value, bool) or not isinstance(value, int | float) or (
            integer and not isinstance(value, int)
        ):
            self.problem(f"{path}.{key}", f"expected {kind}, got {value!r}")
            return default
        if not math.isfinite(value):
            self.problem(f"{path}.{key}", f"expected a finite number, got {value!r}")
            return default
        if low is not None and value < low:
            self.problem(f"{path}.{key}", f"must be at least {low}, got {value!r}")
            return default
        if high is not None and value > high:
            self.problem(f"{path}.{key}", f"must be at most {high}, got {value!r}")
            return default
        return value

    def string(
        self,
        data: dict[str, Any],
        key: str,
        path: str,
        default: str | None,
        choices: tuple[str, ...] | None = None,
    ) -> Any:
        value = data.get(key, default)
        if value is None:
            return None
        if not isinstance(value, str):
            self.problem(f"{path}.{key}", f"expected a string, got {value!r}")
            return default
        if choices is not None and value not in choices:
            self.problem(f"{path}.{key}", f"must be one of {', '.join(choices)}, got {value!r}")
            return default
        return value

    def flag(self, data: dict[str, Any], key: str, path: str, default: bool) -> bool:
        value = data.get(key, default)
        if not isinstance(value, bool):
            self.problem(f"{path}.{key}", f"expected true or false, got {value!r}")
            return default
        return value

    def names(self, data: dict[str, Any], key: str, path: str) -> tuple[str, ...]:
        value = data.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.problem(f"{path}.{key}", "expected a list of target names")
            return ()
        return tuple(value)


_TIMEOUT_KEYS = ("connect", "first_chunk", "idle", "total")
_SIM_KEYS = ("first_chunk_ms", "jitter_ms", "chunk_ms", "chunks", "fail_rate", "fail_status", "seed",
             "stall_rate", "stall_ms", "load_ms")
_PROVIDER_KEYS = (
    "kind",
    "base_url",
    "api_key_env",
    "timeouts",
    "max_concurrent",
    "queue",
    "simulate",
    "anthropic_version",
    "default_max_tokens",
)
_TARGET_KEYS = (
    "provider",
    "model",
    "name",
    "retry",
    "weight",
    "quality",
    "context_window",
    "price",
)
_FASTEST_KEYS = tuple(Fastest.__dataclass_fields__)
_ROUTE_KEYS = (
    "strategy",
    "targets",
    "fastest",
    "allow",
    "deny",
    "min_context_window",
    "min_quality",
    "cooldown",
    "score",
    "hedge",
)
_TOP_KEYS = (
    "listen",
    "ops_listen",
    "clients",
    "access_log",
    "ledger",
    "providers",
    "routes",
    "max_body_bytes",
    "shutdown_grace",
)


def parse_simulate(r: _Reader, raw: Any, path: str) -> Simulate:
    data = r.mapping(raw, path, _SIM_KEYS)
    d = Simulate()
    return Simulate(
        first_chunk_ms=r.number(data, "first_chunk_ms", path, d.first_chunk_ms, low=0),
        jitter_ms=r.number(data, "jitter_ms", path, d.jitter_ms, low=0),
        chunk_ms=r.number(data, "chunk_ms", path, d.chunk_ms, low=0),
        chunks=r.number(data, "chunks", path, d.chunks, low=1, integer=True),
        fail_rate=r.number(data, "fail_rate", path, d.fail_rate, low=0, high=1),
        fail_status=r.number(data, "fail_status", path, d.fail_status, low=400, high=599, integer=True),
        seed=r.number(data, "seed", path, None, integer=True),
        stall_rate=r.number(data, "stall_rate", path, d.stall_rate, low=0, high=1),
        stall_ms=r.number(data, "stall_ms", path, d.stall_ms, low=0),
        load_ms=r.number(data, "load_ms", path, d.load_ms, low=0),
    )


def _provider(r: _Reader, name: str, raw: Any, env: Mapping[str, str]) -> Provider | None:
    path = f"providers.{name}"
    data = r.mapping(raw, path, _PROVIDER_KEYS)
    if not _NAME.match(name):
        r.problem(path, "provider names may use letters, digits and . _ : / @ + - only")
    kind = r.string(data, "kind", path, None, KINDS)
    if kind is None:
        if "kind" not in data:
            r.problem(f"{path}.kind", f"required (one of {', '.join(KINDS)})")
        return None
    base_url = r.string(data, "base_url", path, "")
    if kind != "simulated" and not base_url:
        r.problem(f"{path}.base_url", f"required for kind {kind}")
    elif base_url and not base_url.startswith(("http://", "https://")):
        r.problem(f"{path}.base_url", f"must start with http:// or https://, got {base_url!r}")
    key_env = r.string(data, "api_key_env", path, None)
    tdata = r.mapping(data.get("timeouts"), f"{path}.timeouts", _TIMEOUT_KEYS)
    td = Timeouts()
    timeouts = Timeouts(
        *(r.number(tdata, k, f"{path}.timeouts", getattr(td, k), low=0.001) for k in _TIMEOUT_KEYS)
    )
    if "simulate" in data and kind != "simulated":
        r.problem(f"{path}.simulate", "only for kind simulated")
    return Provider(
        name=name,
        kind=kind,
        base_url=(base_url or "").rstrip("/"),
        api_key_env=key_env,
        api_key=env.get(key_env) if key_env else None,
        timeouts=timeouts,
        max_concurrent=r.number(data, "max_concurrent", path, 0, low=0, integer=True),
        queue=r.number(data, "queue", path, 0, low=0, integer=True),
        simulate=parse_simulate(r, data.get("simulate"), f"{path}.simulate"),
        anthropic_version=r.string(data, "anthropic_version", path, "2023-06-01"),
        default_max_tokens=r.number(data, "default_max_tokens", path, 4096, low=1, integer=True),
    )


def _target(r: _Reader, raw: Any, path: str, providers: Mapping[str, Provider]) -> Target | None:
    data = r.mapping(raw, path, _TARGET_KEYS)
    provider = r.string(data, "provider", path, None)
    model = r.string(data, "model", path, None)
    if provider is None:
        r.problem(f"{path}.provider", "required")
    elif provider not in providers:
        r.problem(f"{path}.provider", f"unknown provider {provider!r}")
    if model is None:
        r.problem(f"{path}.model", "required (the upstream model name)")
    price = None
    if data.get("price") is not None:
        pdata = r.mapping(data["price"], f"{path}.price", ("input", "output"))
        p_in = r.number(pdata, "input", f"{path}.price", None, low=0)
        p_out = r.number(pdata, "output", f"{path}.price", None, low=0)
        if p_in is None or p_out is None:
            r.problem(f"{path}.price", "needs both input and output (USD per million tokens)")
        else:
            price = Price(p_in, p_out)
    name = r.string(data, "name", path, None)
    if name is not None and not _NAME.match(name):
        r.problem(f"{path}.name", f"{name!r}: use letters, digits and . _ : / @ + - only")
    if provider is None or model is None:
        return None
    return Target(
        name=name or "",  # filled in by _route once the whole list is known
        provider=provider,
        model=model,
        retry=r.number(data, "retry", path, 0, low=0, high=10, integer=True),
        weight=r.number(data, "weight", path, 1.0, low=0),
        quality=r.number(data, "quality", path, None, low=0, high=1),
        context_window=r.number(data, "context_window", path, None, low=1, integer=True),
        price=price,
    )


def _route(r: _Reader, name: str, raw: Any, providers: Mapping[str, Provider]) -> Route | None:
    path = f"routes.{name}"
    data = r.mapping(raw, path, _ROUTE_KEYS)
    if not _NAME.match(name) or "/" in name:
        r.problem(path, "route names may use letters, digits and . _ : @ + - only (no /)")
    strategy = r.string(data, "strategy", path, "ordered", STRATEGIES)
    raw_targets = data.get("targets")
    if not isinstance(raw_targets, list) or not raw_targets:
        r.problem(f"{path}.targets", "required: a non-empty list of targets")
        raw_targets = []
    parsed = [_target(r, t, f"{path}.targets[{i}]", providers) for i, t in enumerate(raw_targets)]
    counts: dict[str, int] = {}
    for t in parsed:
        if t is not None:
            counts[t.provider] = counts.get(t.provider, 0) + 1
    targets: list[Target] = []
    seen: dict[str, int] = {}
    for i, t in enumerate(parsed):
        if t is None:
            continue
        if not t.name:
            default = t.provider if counts[t.provider] == 1 else f"{t.provider}/{t.model}"
            if not _NAME.match(default):
                r.problem(f"{path}.targets[{i}].name", f"required: default {default!r} has unsafe characters")
            t = replace(t, name=default)
        if t.name in seen:
            r.problem(f"{path}.targets[{i}].name", f"duplicate target name {t.name!r} (also targets[{seen[t.name]}])")
        seen[t.name] = i
        targets.append(t)

    fdata = r.mapping(data.get("fastest"), f"{path}.fastest", _FASTEST_KEYS)
    fd = Fastest()
    fp = f"{path}.fastest"
    fastest = Fastest(
        signal=r.string(fdata, "signal", fp, fd.signal, SIGNALS),
        alpha=r.number(fdata, "alpha", fp, fd.alpha, low=0.001, high=1),
        window=r.number(fdata, "window", fp, fd.window, low=1, high=10000, integer=True),
        min_samples=r.number(fdata, "min_samples", fp, fd.min_samples, low=1, integer=True),
        max_age_secs=r.number(fdata, "max_age_secs", fp, fd.max_age_secs, low=0.001),
        explore=r.number(fdata, "explore", fp, fd.explore, low=0, high=1),
        seed=r.number(fdata, "seed", fp, None, integer=True),
        quality_weight=r.number(fdata, "quality_weight", fp, fd.quality_weight, low=0, high=1),
        latency_target_ms=r.number(fdata, "latency_target_ms", fp, fd.latency_target_ms, low=0.001),
        unknown_quality=r.number(fdata, "unknown_quality", fp, fd.unknown_quality, low=0, high=1),
        load_aware=r.flag(fdata, "load_aware", fp, fd.load_aware),
        load_weight=r.number(fdata, "load_weight", fp, fd.load_weight, low=0, high=100),
    )
    cdata = r.mapping(data.get("cooldown"), f"{path}.cooldown", ("failures", "secs"))
    cooldown = Cooldown(
        failures=r.number(cdata, "failures", f"{path}.cooldown", 3, low=1, integer=True),
        secs=r.number(cdata, "secs", f"{path}.cooldown", 30.0, low=0.001, high=300),
    )
    sdata = r.mapping(data.get("score"), f"{path}.score", ("speed", "cost", "health", "quality"))
    score = ScoreWeights(
        *(r.number(sdata, k, f"{path}.score", 1.0, low=0) for k in ("speed", "cost", "health", "quality"))
    )
    allow = r.names(data, "allow", path)
    deny = r.names(data, "deny", path)
    for key, names in (("allow", allow), ("deny", deny)):
        for n in names:
            if n not in seen:
                r.problem(f"{path}.{key}", f"unknown target {n!r} (targets: {', '.join(seen)})")
    return Route(
        name=name,
        strategy=strategy,
        targets=tuple(targets),
        fastest=fastest,
        allow=allow,
        deny=deny,
        min_context_window=r.number(data, "min_context_window", path, None, low=1, integer=True),
        min_quality=r.number(data, "min_quality", path, None, low=0, high=1),
        cooldown=cooldown,
        score=score,
        hedge=_hedge(r, data.get("hedge"), f"{path}.hedge"),
    )


def _hedge(r: _Reader, raw: Any, path: str) -> Hedge | None:
    if raw is None:
        return None
    data = r.mapping(raw, path, ("after", "max_extra", "explore", "refresh"))
    after = data.get("after", "p90")
    secs: float | None = None
    percentile: int | None = None
    if isinstance(after, str) and re.fullmatch(r"p([1-9][0-9]?)", after):
        percentile = int(after[1:])
    elif isinstance(after, int | float) and not isinstance(after, bool):
        secs = r.number(data, "after", path, None, low=0.001, high=600)
    else:
        r.problem(f"{path}.after", f"expected seconds (0.8) or pNN of the leader's samples (p90), got {after!r}")
    return Hedge(
        after_secs=secs,
        after_percentile=percentile,
        max_extra=r.number(data, "max_extra", path, 0.1, low=0, high=1),
        explore=r.flag(data, "explore", path, True),
        refresh_secs=r.number(data, "refresh", path, 5.0, low=0.001),
    )


def parse_config(raw: Any, env: Mapping[str, str] | None = None, source: str = "<memory>") -> Config:
    """Validate a loaded YAML document; raise ConfigError naming every problem."""
    env = os.environ if env is None else env
    problems: list[str] = []
    r = _Reader(problems)
    data = r.mapping(raw, "(top)", _TOP_KEYS)
    listen = r.string(data, "listen", "(top)", "127.0.0.1:8080")
    ops_listen = r.string(data, "ops_listen", "(top)", None)
    for key, value in (("listen", listen), ("ops_listen", ops_listen)):
        if value is not None and not re.match(r"^(\[[0-9a-fA-F:]+\]|[^:\s]*):\d{1,5}$", value):
            r.problem(key, f"expected HOST:PORT, got {value!r}")

    providers: dict[str, Provider] = {}
    raw_providers = r.mapping(data.get("providers"), "providers", tuple(data.get("providers") or ()))
    if not raw_providers:
        r.problem("providers", "required: at least one provider")
    for pname, praw in raw_providers.items():
        provider = _provider(r, str(pname), praw, env)
        if provider is not None:
            providers[str(pname)] = provider

    routes: dict[str, Route] = {}
    raw_routes = r.mapping(data.get("routes"), "routes", tuple(data.get("routes") or ()))
    if not raw_routes:
        r.problem("routes", "required: at least one route")
    for rname, rraw in raw_routes.items():
        route = _route(r, str(rname), rraw, providers)
        if route is not None:
            routes[str(rname)] = route

    cdata = r.mapping(data.get("clients"), "clients", ("keys_env",))
    keys_env = r.string(cdata, "keys_env", "clients", None)
    keys: tuple[str, ...] = ()
    if keys_env:
        keys = tuple(k.strip() for k in env.get(keys_env, "").split(",") if k.strip())
        if not keys:
            r.problem("clients.keys_env", f"environment variable {keys_env} is unset or empty")
    adata = r.mapping(data.get("access_log"), "access_log", ("format", "path"))
    ldata = r.mapping(data.get("ledger"), "ledger", ("path", "retention_days", "queue"))
    config = Config(
        listen=listen,
        ops_listen=ops_listen,
        providers=providers,
        routes=routes,
        clients=Clients(keys_env=keys_env, keys=keys),
        access_log=AccessLog(
            format=r.string(adata, "format", "access_log", "text", ("text", "json")),
            path=r.string(adata, "path", "access_log", "-"),
        ),
        ledger=Ledger(
            path=r.string(ldata, "path", "ledger", None),
            retention_days=r.number(ldata, "retention_days", "ledger", 30.0, low=0.001),
            queue=r.number(ldata, "queue", "ledger", 10000, low=1, integer=True),
        ),
        max_body_bytes=r.number(data, "max_body_bytes", "(top)", 4 * 1024 * 1024, low=1024, integer=True),
        shutdown_grace=r.number(data, "shutdown_grace", "(top)", 30.0, low=0),
        source=source,
    )
    if problems:
        raise ConfigError(source, problems)
    return config


def load_config(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> Config:
    """Read and validate a routes file."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(source, [f"(file): cannot read: {exc.strerror or exc}"]) from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(source, [f"(file): not valid YAML: {exc}"]) from exc
    return parse_config(raw, env, source)
