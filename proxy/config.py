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
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from yarl import URL

from .bounds import MAX_YAML_DEPTH, MAX_YAML_NODES
from .errors import ConfigError

KINDS = ("openai", "anthropic", "simulated", "azure")
STRATEGIES = ("ordered", "weighted", "fastest", "cheapest", "score")
SIGNALS = ("ewma", "p50")
_NAME = re.compile(r"^[A-Za-z0-9._:/@+\-]+$")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP token (RFC 9110)
AZURE_API_VERSION = "2024-10-21"  # the latest GA api-version of Azure OpenAI's data plane
# Headers a provider's `headers:` may not set: credentials (secrets never sit in the file: use
# api_key_env) and the ones firstbyte writes itself.
_OWN_HEADERS = frozenset({
    "authorization", "x-api-key", "api-key", "proxy-authorization", "cookie", "content-type",
    "content-length", "content-encoding", "transfer-encoding", "host", "connection", "te", "upgrade",
    "anthropic-version",
})

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
    responses: bool = False  # serves the Responses API itself: /v1/responses goes as it is
    headers: tuple[tuple[str, str], ...] = ()  # static extra headers on every upstream call
    api_version: str = AZURE_API_VERSION  # kind azure: the api-version query parameter

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
    refresh_secs: float = 0.5  # under a race, a target not measured for this long is explored
    cap: float = 4.0  # an explored loser runs on for this many times the winner's first token (routing/hedge.py)


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
class Connections:
    """Client connections on the listeners: how long one may take, and how many may be open.

    A connection has ``header_timeout`` from its opening (or from the first byte of its next
    request) to send a whole request head, and ``body_timeout`` from then to send the body;
    between requests it may idle ``keepalive_timeout``. Beyond ``max`` open connections a new
    one is answered 503 and closed. They take effect on restart, like ``listen``."""

    max: int = 4096
    header_timeout: float = 10.0
    body_timeout: float = 60.0
    keepalive_timeout: float = 15.0


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
    connections: Connections = Connections()
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
                self.problem(f"{path}.{_key(key)}", f"unknown key (expected one of: {', '.join(allowed)})")
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
            self.problem(f"{path}.{key}", f"expected {kind}, got {_show(value)}")
            return default
        if not math.isfinite(value):
            self.problem(f"{path}.{key}", f"expected a finite number, got {_show(value)}")
            return default
        if low is not None and value < low:
            self.problem(f"{path}.{key}", f"must be at least {low}, got {_show(value)}")
            return default
        if high is not None and value > high:
            self.problem(f"{path}.{key}", f"must be at most {high}, got {_show(value)}")
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
            self.problem(f"{path}.{key}", f"expected a string, got {_show(value)}")
            return default
        if choices is not None and value not in choices:
            self.problem(f"{path}.{key}", f"must be one of {', '.join(choices)}, got {_show(value)}")
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
    "responses",
    "headers",
    "api_version",
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
    "connections",
)
_CONNECTION_KEYS = ("max", "header_timeout", "body_timeout", "keepalive_timeout")


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
    elif base_url:
        problem = _url_problem(base_url)
        if problem:
            r.problem(f"{path}.base_url", f"{problem}, got {_show(base_url)}")
    key_env = r.string(data, "api_key_env", path, None)
    api_key = env.get(key_env) if key_env else None
    if api_key and not _HEADER_SAFE.fullmatch(api_key):
        # Never the value: only that it would split the upstream request's headers.
        r.problem(f"{path}.api_key_env", f"environment variable {key_env} holds a character other than "
                  "printable ASCII (a CR/LF would split the upstream request's headers); remove it")
    tdata = r.mapping(data.get("timeouts"), f"{path}.timeouts", _TIMEOUT_KEYS)
    td = Timeouts()
    timeouts = Timeouts(
        *(r.number(tdata, k, f"{path}.timeouts", getattr(td, k), low=0.001) for k in _TIMEOUT_KEYS)
    )
    if "simulate" in data and kind != "simulated":
        r.problem(f"{path}.simulate", "only for kind simulated")
    responses = data.get("responses", False)
    if not isinstance(responses, bool):
        r.problem(f"{path}.responses", f"expected true or false, got {responses!r}")
        responses = False
    elif responses and kind != "openai":
        r.problem(f"{path}.responses", "only for kind openai (other kinds get /v1/responses translated)")
    if "api_version" in data and kind != "azure":
        r.problem(f"{path}.api_version", "only for kind azure")
    return Provider(
        name=name,
        kind=kind,
        base_url=(base_url or "").rstrip("/"),
        api_key_env=key_env,
        api_key=api_key,
        timeouts=timeouts,
        max_concurrent=r.number(data, "max_concurrent", path, 0, low=0, integer=True),
        queue=r.number(data, "queue", path, 0, low=0, integer=True),
        simulate=parse_simulate(r, data.get("simulate"), f"{path}.simulate"),
        anthropic_version=r.string(data, "anthropic_version", path, "2023-06-01"),
        default_max_tokens=r.number(data, "default_max_tokens", path, 4096, low=1, integer=True),
        responses=responses,
        headers=_headers(r, data.get("headers"), f"{path}.headers", kind),
        api_version=r.string(data, "api_version", path, AZURE_API_VERSION),
    )


def _headers(r: _Reader, raw: Any, path: str, kind: str) -> tuple[tuple[str, str], ...]:
    """A provider's static extra headers (OpenRouter's HTTP-Referer and X-Title, a gateway's
    routing tag…): names are HTTP tokens, values printable, credentials refused."""
    if raw is None:
        return ()
    if kind == "simulated":
        r.problem(path, "only for kinds that call over HTTP (not simulated)")
        return ()
    if not isinstance(raw, dict):
        r.problem(path, f"expected a mapping of header name to value, got {type(raw).__name__}")
        return ()
    out: list[tuple[str, str]] = []
    for name, value in raw.items():
        where = f"{path}.{name}"
        if not isinstance(name, str) or not _HEADER_NAME.match(name):
            r.problem(where, "not a valid header name (letters, digits and !#$%&'*+.^_`|~- only)")
        elif name.lower() in _OWN_HEADERS:
            reason = ("a credential: name its environment variable in api_key_env instead"
                      if name.lower() in ("authorization", "x-api-key", "api-key", "proxy-authorization", "cookie")
                      else "set by firstbyte itself")
            r.problem(where, f"may not be set here ({reason})")
        elif isinstance(value, bool) or not isinstance(value, str | int | float):
            r.problem(where, f"expected a string, got {value!r}")
        elif any(c in str(value) for c in "\r\n\0"):
            r.problem(where, "value may not contain line breaks or NUL")
        else:
            out.append((name, str(value)))
    return tuple(out)


def _target(r: _Reader, raw: Any, path: str, providers: Mapping[str, Provider]) -> Target | None:
    data = r.mapping(raw, path, _TARGET_KEYS)
    provider = r.string(data, "provider", path, None)
    model = r.string(data, "model", path, None)
    if provider is None:
        r.problem(f"{path}.provider", "required")
    elif provider not in providers:
        r.problem(f"{path}.provider", f"unknown provider {_show(provider)}")
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
        r.problem(f"{path}.name", f"{_show(name)}: use letters, digits and . _ : / @ + - only")
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
                r.problem(f"{path}.targets[{i}].name", f"required: default {_show(default)} has unsafe characters")
            t = replace(t, name=default)
        if t.name in seen:
            r.problem(f"{path}.targets[{i}].name",
                      f"duplicate target name {_show(t.name)} (also targets[{seen[t.name]}])")
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
                r.problem(f"{path}.{key}", f"unknown target {_show(n)} (targets: {', '.join(seen)})")
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
    data = r.mapping(raw, path, ("after", "max_extra", "explore", "refresh", "cap"))
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
        refresh_secs=r.number(data, "refresh", path, 0.5, low=0.001),
        cap=r.number(data, "cap", path, 4.0, low=1, high=100),
    )


def _connections(r: _Reader, raw: Any) -> Connections:
    data = r.mapping(raw, "connections", _CONNECTION_KEYS)
    d = Connections()
    return Connections(
        max=r.number(data, "max", "connections", d.max, low=1, integer=True),
        header_timeout=r.number(data, "header_timeout", "connections", d.header_timeout, low=0.01),
        body_timeout=r.number(data, "body_timeout", "connections", d.body_timeout, low=0.01),
        keepalive_timeout=r.number(data, "keepalive_timeout", "connections", d.keepalive_timeout, low=0.01),
    )


_HEADER_SAFE = re.compile(r"[\x20-\x7e]+")


def _url_problem(url: str) -> str | None:
    """What makes ``url`` unusable as a provider's base URL, or None."""
    if not url.startswith(("http://", "https://")):
        return "must start with http:// or https://"
    if not _HEADER_SAFE.fullmatch(url) or " " in url:
        return "must be printable ASCII without spaces"
    try:
        parsed = URL(url)
        parsed.port  # noqa: B018 - a port out of range raises here
    except ValueError as exc:
        return f"is not a URL ({exc})"
    if not parsed.host:
        return "has no host"
    if parsed.user is not None or parsed.password is not None:
        return "must not hold credentials (name the key's variable in api_key_env)"
    if parsed.query_string or parsed.fragment:
        return "must not have a query or fragment"
    return None


_SHOW = reprlib.Repr()
_SHOW.maxlevel, _SHOW.maxlist, _SHOW.maxdict, _SHOW.maxstring, _SHOW.maxother = 2, 4, 4, 80, 80


def _show(value: Any) -> str:
    """A value in a problem message, bounded: an alias bomb or a megabyte string prints a few words."""
    return _SHOW.repr(value)


def _key(value: Any) -> str:
    """A mapping key as it goes into a problem's path."""
    return value if isinstance(value, str) and len(value) <= 80 else _show(value)


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
            r.problem(key, f"expected HOST:PORT, got {_show(value)}")

    providers: dict[str, Provider] = {}
    raw_providers = r.mapping(data.get("providers"), "providers", tuple(data.get("providers") or ()))
    if not raw_providers:
        r.problem("providers", "required: at least one provider")
    for pname, praw in raw_providers.items():
        provider = _provider(r, _key(pname), praw, env)
        if provider is not None:
            providers[str(pname)] = provider

    routes: dict[str, Route] = {}
    raw_routes = r.mapping(data.get("routes"), "routes", tuple(data.get("routes") or ()))
    if not raw_routes:
        r.problem("routes", "required: at least one route")
    for rname, rraw in raw_routes.items():
        route = _route(r, _key(rname), rraw, providers)
        if route is not None:
            routes[str(rname)] = route

    cdata = r.mapping(data.get("clients"), "clients", ("keys_env",))
    keys_env = r.string(cdata, "keys_env", "clients", None)
    keys: tuple[str, ...] = ()
    if keys_env:
        keys = tuple(k.strip() for k in env.get(keys_env, "").split(",") if k.strip())
        if not keys:
            r.problem("clients.keys_env", f"environment variable {keys_env} is unset or empty")
        elif not all(_HEADER_SAFE.fullmatch(k) for k in keys):
            r.problem("clients.keys_env", f"environment variable {keys_env} holds a key with a character "
                      "other than printable ASCII; no client could send it in a header")
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
        connections=_connections(r, data.get("connections")),
        source=source,
    )
    if problems:
        raise ConfigError(source, problems)
    return config


def _yaml_problem(source: str, exc: yaml.YAMLError) -> str:
    """A YAML syntax error as ``FILE:LINE:COLUMN: what`` (PyYAML's own text names
    ``<unicode string>`` instead of the file, and spreads over several lines)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
    return f"{where}: not valid YAML: {problem}" + (f" ({context})" if context else "")


def load_config(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> Config:
    """Read and validate a routes file."""
    source = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(source, [f"(file): cannot read: {exc.strerror or exc}"]) from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(source, [f"(file): not valid UTF-8 (line {line}, byte {exc.start})"]) from None
    return parse_config(read_yaml(text, source), env, source)


_FLOW_NESTING = re.compile(r"(?:[\[{]\s*|-[ \t]+){" + str(MAX_YAML_DEPTH + 1) + "}")  # [[[[, {{{{ or - - - -


def read_yaml(text: str, source: str = "<memory>") -> Any:
    """The YAML document in ``text``, refused (ConfigError) when it is not one firstbyte should read:
    duplicate keys (named by path), nesting past ``MAX_YAML_DEPTH``, aliases that expand past
    ``MAX_YAML_NODES`` nodes (an alias bomb is refused before anything expands it)."""
    if _FLOW_NESTING.search(text):  # PyYAML's scanner slows quadratically per flow level: refuse first
        raise ConfigError(source, [f"(file): nested too deeply (at most {MAX_YAML_DEPTH} levels)"])
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise ConfigError(source, [f"(file): nested too deeply (at most {MAX_YAML_DEPTH} levels)"]) from None
        except yaml.YAMLError as exc:
            raise ConfigError(source, [_yaml_problem(source, exc)]) from None
        if node is None:
            return None
        problems = _node_problems(node)
        if problems:
            raise ConfigError(source, problems)
        try:
            return loader.construct_document(node)
        except yaml.YAMLError as exc:
            raise ConfigError(source, [_yaml_problem(source, exc)]) from None
    finally:
        loader.dispose()


def _node_problems(root: yaml.Node) -> list[str]:
    """Duplicate keys, depth and expanded size of a composed document, each node visited once
    (an alias is the same node object again, so nothing here expands the alias graph)."""
    problems: list[str] = []
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, str]] = [(root, "(top)")]
    while stack:  # pre-order, first path wins: duplicate keys
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, int] = {}
            for key, value in node.value:
                name = key.value if isinstance(key, yaml.ScalarNode) else None
                where = _key(name) if path == "(top)" else f"{path}.{_key(name)}"
                if name is not None and name in first:
                    problems.append(f"{where}: duplicate key (lines {first[name]} and {key.start_mark.line + 1})")
                elif name is not None:
                    first[name] = key.start_mark.line + 1
                stack.append((value, where))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, f"{path}[{i}]") for i, item in enumerate(node.value))
    if problems:
        return problems
    # Post-order, memoised by node: depth and the node count once aliases are expanded.
    sizes: dict[int, tuple[int, int]] = {}
    order: list[yaml.Node] = []
    pending: list[yaml.Node] = [root]
    visited: set[int] = set()
    while pending:
        node = pending.pop()
        if id(node) in visited:
            continue
        visited.add(id(node))
        order.append(node)
        pending.extend(_children(node))
    for node in reversed(order):  # children before parents (a composed document has no cycles)
        size, depth = 1, 1
        for child in _children(node):
            child_size, child_depth = sizes.get(id(child), (1, 1))
            size = min(size + child_size, MAX_YAML_NODES + 1)
            depth = max(depth, child_depth + 1)
        sizes[id(node)] = (size, depth)
    size, depth = sizes[id(root)]
    if depth > MAX_YAML_DEPTH:
        problems.append(f"(file): nested {depth} levels deep; at most {MAX_YAML_DEPTH} are read")
    if size > MAX_YAML_NODES:
        problems.append(f"(file): aliases expand to more than {MAX_YAML_NODES} nodes (an alias bomb?); "
                        "write the values out or share fewer")
    return problems


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []
