"""routes.yaml read and validated in one pass, every problem with its path.

``load_config`` reads the file and returns a frozen :class:`Config`, or raises
:class:`ConfigError` listing every problem (``routes.chat.targets[1].provider: unknown
provider 'grok'``). Defaults come from the model's dataclasses. Nothing here opens sockets or
databases; the server builds those from a valid Config. Provider keys are read from the
environment or a file at load time (``credentials.py``), so a reload picks up a rotated key.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .credentials import HEADER_SAFE, provider_key
from .document import read_yaml
from .fields import Flag, Num, Reader, Spec, Text, default, fill, key_of, listen_problem, parsed_url, section, show
from .model import (
    DEFAULT_STRATEGY,
    KINDS,
    SIGNALS,
    STRATEGIES,
    AccessLog,
    Clients,
    Config,
    Connections,
    Cooldown,
    Fastest,
    Hedge,
    Ledger,
    Price,
    Provider,
    Route,
    ScoreWeights,
    Simulate,
    Target,
    Timeouts,
)
from .state_link import read_state
from .tracing import tracing_section
from .workers import read_workers

__all__ = ["load_config", "parse_config"]

_NAME = re.compile(r"^[A-Za-z0-9._:/@+\-]+$")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP token (RFC 9110)
_CREDENTIALS = ("authorization", "x-api-key", "api-key", "proxy-authorization", "cookie")
# Headers a provider's `headers:` may not set: credentials (secrets never sit in the file: use
# api_key_env) and the ones firstbyte writes itself.
_OWN_HEADERS = frozenset({
    *_CREDENTIALS, "content-type", "content-length", "content-encoding", "transfer-encoding", "host",
    "connection", "te", "upgrade", "anthropic-version",
})

# The sections read from a table: each key, in the order problems are reported, and its bounds.
_TIMEOUTS: dict[str, Spec] = {k: Num(low=0.001) for k in ("connect", "first_chunk", "idle", "total")}
_SIMULATE: dict[str, Spec] = {
    "first_chunk_ms": Num(low=0), "jitter_ms": Num(low=0), "chunk_ms": Num(low=0),
    "chunks": Num(low=1, integer=True), "fail_rate": Num(low=0, high=1),
    "fail_status": Num(low=400, high=599, integer=True), "seed": Num(integer=True),
    "stall_rate": Num(low=0, high=1), "stall_ms": Num(low=0), "load_ms": Num(low=0),
}
_FASTEST: dict[str, Spec] = {
    "signal": Text(SIGNALS), "alpha": Num(low=0.001, high=1), "window": Num(low=1, high=10000, integer=True),
    "min_samples": Num(low=1, integer=True), "max_age_secs": Num(low=0.001), "explore": Num(low=0, high=1),
    "seed": Num(integer=True), "quality_weight": Num(low=0, high=1), "latency_target_ms": Num(low=0.001),
    "unknown_quality": Num(low=0, high=1), "load_aware": Flag(), "load_weight": Num(low=0, high=100),
    "load_fit": Flag()}  # unset, load_fit stays None: the Route's default (on with a hedge)
_COOLDOWN: dict[str, Spec] = {"failures": Num(low=1, integer=True), "secs": Num(low=0.001, high=300)}
_SCORE: dict[str, Spec] = {k: Num(low=0) for k in ("speed", "cost", "health", "quality")}
_CONNECTIONS: dict[str, Spec] = {
    "max": Num(low=1, integer=True), "header_timeout": Num(low=0.01), "body_timeout": Num(low=0.01),
    "keepalive_timeout": Num(low=0.01), "send_timeout": Num(low=0.01),
}
_ACCESS_LOG: dict[str, Spec] = {"format": Text(("text", "json")), "path": Text()}
_LEDGER: dict[str, Spec] = {"path": Text(), "retention_days": Num(low=0.001), "queue": Num(low=1, integer=True)}

_PROVIDER_KEYS = ("kind", "base_url", "api_key_env", "api_key_file", "timeouts", "max_concurrent", "queue",
                  "simulate", "anthropic_version", "default_max_tokens", "responses", "headers", "api_version")
_TARGET_KEYS = ("provider", "model", "name", "retry", "weight", "quality", "context_window", "price")
_ROUTE_KEYS = ("strategy", "targets", "fastest", "allow", "deny", "min_context_window", "min_quality",
               "cooldown", "score", "hedge", "fail_over_on")
_TOP_KEYS = ("listen", "ops_listen", "clients", "access_log", "ledger", "providers", "routes", "max_body_bytes",
             "shutdown_grace", "connections", "tracing", "state", "workers")


def _provider(r: Reader, name: str, raw: Any, env: Mapping[str, str], base: Path) -> Provider | None:
    path = f"providers.{name}"
    data = r.mapping(raw, path, _PROVIDER_KEYS)
    if not _NAME.match(name):
        r.problem(path, "provider names may use letters, digits and . _ : / @ + - only")
    kind = r.string(data, "kind", path, None, KINDS)
    if kind is None:
        if "kind" not in data:
            r.problem(f"{path}.kind", f"required (one of {', '.join(KINDS)})")
        return None
    base_url = _base_url(r, data, path, kind)
    key_env, key_file, api_key = provider_key(r, data, path, env, base)
    timeouts = section(r, Timeouts, data.get("timeouts"), f"{path}.timeouts", _TIMEOUTS)
    if "simulate" in data and kind != "simulated":
        r.problem(f"{path}.simulate", "only for kind simulated")
    responses = r.flag(data, "responses", path, default(Provider, "responses"))
    if responses and kind != "openai":
        r.problem(f"{path}.responses", "only for kind openai (other kinds get /v1/responses translated)")
    if "api_version" in data and kind != "azure":
        r.problem(f"{path}.api_version", "only for kind azure")
    return Provider(
        name=name, kind=kind, base_url=base_url,
        api_key_env=key_env, api_key_file=key_file, api_key=api_key, timeouts=timeouts,
        max_concurrent=r.number(data, "max_concurrent", path, default(Provider, "max_concurrent"), low=0,
                                integer=True),
        queue=r.number(data, "queue", path, default(Provider, "queue"), low=0, integer=True),
        simulate=section(r, Simulate, data.get("simulate"), f"{path}.simulate", _SIMULATE),
        anthropic_version=r.string(data, "anthropic_version", path, default(Provider, "anthropic_version")),
        default_max_tokens=r.number(data, "default_max_tokens", path, default(Provider, "default_max_tokens"),
                                    low=1, integer=True),
        responses=responses,
        headers=_headers(r, data.get("headers"), f"{path}.headers", kind),
        api_version=r.string(data, "api_version", path, default(Provider, "api_version")),
    )


def _base_url(r: Reader, data: dict[str, Any], path: str, kind: str) -> str:
    """Required but for the simulated kind; a URL firstbyte can call as it is, without its trailing /."""
    base_url = r.string(data, "base_url", path, default(Provider, "base_url"))
    if kind != "simulated" and not base_url:
        r.problem(f"{path}.base_url", f"required for kind {kind}")
    elif base_url and (problem := _url_problem(base_url)):
        r.problem(f"{path}.base_url", f"{problem}, got {show(base_url)}")
    return (base_url or "").rstrip("/")


def _headers(r: Reader, raw: Any, path: str, kind: str) -> tuple[tuple[str, str], ...]:
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
                      if name.lower() in _CREDENTIALS else "set by firstbyte itself")
            r.problem(where, f"may not be set here ({reason})")
        elif isinstance(value, bool) or not isinstance(value, str | int | float):
            r.problem(where, f"expected a string, got {value!r}")
        elif any(c in str(value) for c in "\r\n\0"):
            r.problem(where, "value may not contain line breaks or NUL")
        else:
            out.append((name, str(value)))
    return tuple(out)


def _target(r: Reader, raw: Any, path: str, providers: Mapping[str, Provider]) -> Target | None:
    data = r.mapping(raw, path, _TARGET_KEYS)
    provider = r.string(data, "provider", path, None)
    model = r.string(data, "model", path, None)
    if provider is None:
        r.problem(f"{path}.provider", "required")
    elif provider not in providers:
        r.problem(f"{path}.provider", f"unknown provider {show(provider)}")
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
        r.problem(f"{path}.name", f"{show(name)}: use letters, digits and . _ : / @ + - only")
    if provider is None or model is None:
        return None
    return Target(
        name=name or "",  # filled in by _targets once the whole list is known
        provider=provider,
        model=model,
        retry=r.number(data, "retry", path, default(Target, "retry"), low=0, high=10, integer=True),
        weight=r.number(data, "weight", path, default(Target, "weight"), low=0),
        quality=r.number(data, "quality", path, default(Target, "quality"), low=0, high=1),
        context_window=r.number(data, "context_window", path, default(Target, "context_window"), low=1,
                                integer=True),
        price=price,
    )


def _targets(r: Reader, raw: Any, path: str, providers: Mapping[str, Provider]) -> list[Target]:
    """A route's targets, each named (by default its provider, or provider/model when the provider
    appears twice) and no name twice."""
    if not isinstance(raw, list) or not raw:
        r.problem(f"{path}.targets", "required: a non-empty list of targets")
        raw = []
    parsed = [_target(r, t, f"{path}.targets[{i}]", providers) for i, t in enumerate(raw)]
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
            name = t.provider if counts[t.provider] == 1 else f"{t.provider}/{t.model}"
            if not _NAME.match(name):
                r.problem(f"{path}.targets[{i}].name", f"required: default {show(name)} has unsafe characters")
            t = replace(t, name=name)
        if t.name in seen:
            r.problem(f"{path}.targets[{i}].name",
                      f"duplicate target name {show(t.name)} (also targets[{seen[t.name]}])")
        seen[t.name] = i
        targets.append(t)
    return targets


def _route(r: Reader, name: str, raw: Any, providers: Mapping[str, Provider]) -> Route | None:
    path = f"routes.{name}"
    data = r.mapping(raw, path, _ROUTE_KEYS)
    if not _NAME.match(name) or "/" in name:
        r.problem(path, "route names may use letters, digits and . _ : @ + - only (no /)")
    strategy = r.string(data, "strategy", path, DEFAULT_STRATEGY, STRATEGIES)
    targets = _targets(r, data.get("targets"), path, providers)
    fastest = section(r, Fastest, data.get("fastest"), f"{path}.fastest", _FASTEST)
    cooldown = section(r, Cooldown, data.get("cooldown"), f"{path}.cooldown", _COOLDOWN)
    score = section(r, ScoreWeights, data.get("score"), f"{path}.score", _SCORE)
    allow = r.names(data, "allow", path)
    deny = r.names(data, "deny", path)
    names = list(dict.fromkeys(t.name for t in targets))
    for key, listed in (("allow", allow), ("deny", deny)):
        for n in listed:
            if n not in names:
                r.problem(f"{path}.{key}", f"unknown target {show(n)} (targets: {', '.join(names)})")
    return Route(
        name=name,
        strategy=strategy,
        targets=tuple(targets),
        fastest=fastest,
        allow=allow,
        deny=deny,
        min_context_window=r.number(data, "min_context_window", path, default(Route, "min_context_window"),
                                    low=1, integer=True),
        min_quality=r.number(data, "min_quality", path, default(Route, "min_quality"), low=0, high=1),
        cooldown=cooldown,
        score=score,
        hedge=_hedge(r, data["hedge"], f"{path}.hedge") if "hedge" in data else (
            _hedge(r, {}, f"{path}.hedge") if strategy == "fastest" else None),
        fail_over_on=r.statuses(data, "fail_over_on", path),
    )


def _hedge(r: Reader, raw: Any, path: str) -> Hedge | None:
    """``hedge:``; a ``fastest`` route that says nothing races with the defaults (docs/routing.md, "The
    default"): without racing, a shift in the targets' speeds is seen only by chance; ``false`` turns it off.
    A bare ``hedge:`` (YAML null) is ``{}``, as a bare ``cooldown:`` is: it names racing, so it races."""
    if raw is False:
        return None
    if raw is None or raw is True:
        raw = {}
    data = r.mapping(raw, path, ("after", "max_extra", "explore", "refresh", "cap"))
    after = data.get("after", f"p{default(Hedge, 'after_percentile')}")
    secs: float | None = None
    percentile: int | None = None
    if isinstance(after, str) and re.fullmatch(r"p([1-9][0-9]?)", after):
        percentile = int(after[1:])
    elif isinstance(after, int | float) and not isinstance(after, bool):
        secs = r.number(data, "after", path, None, low=0.001, high=600)
    else:
        r.problem(f"{path}.after",
                  f"expected seconds (0.8) or pNN of the leader's samples, p1 to p99 (p90), got {after!r}")
    return Hedge(
        after_secs=secs,
        after_percentile=percentile,
        max_extra=r.number(data, "max_extra", path, default(Hedge, "max_extra"), low=0, high=1),
        explore=r.flag(data, "explore", path, default(Hedge, "explore")),
        refresh_secs=r.number(data, "refresh", path, default(Hedge, "refresh_secs"), low=0.001),
        cap=r.number(data, "cap", path, default(Hedge, "cap"), low=1, high=100),
    )


def _url_problem(url: str) -> str | None:
    """What makes ``url`` unusable as a provider's base URL, or None."""
    if not url.startswith(("http://", "https://")):
        return "must start with http:// or https://"
    if not HEADER_SAFE.fullmatch(url) or " " in url:
        return "must be printable ASCII without spaces"
    parsed = parsed_url(url)
    if isinstance(parsed, str):
        return parsed
    if parsed.user is not None or parsed.password is not None:
        return "must not hold credentials (name the key's variable in api_key_env)"
    if parsed.query_string or parsed.fragment:
        return "must not have a query or fragment"
    return None


def _named(r: Reader, data: dict[str, Any], key: str, what: str) -> dict[str, Any]:
    """``providers`` or ``routes``: a mapping by name, at least one."""
    value = data.get(key)
    raw = r.mapping(value, key, tuple(value) if isinstance(value, dict) else ())  # any name; not a list
    if not raw:
        r.problem(key, f"required: at least one {what}")
    return raw


def _clients(r: Reader, raw: Any, env: Mapping[str, str]) -> Clients:
    """Client keys come from the environment, like provider keys: never from the file."""
    data = r.mapping(raw, "clients", ("keys_env",))
    keys_env = r.string(data, "keys_env", "clients", default(Clients, "keys_env"))
    keys: tuple[str, ...] = ()
    if keys_env:
        keys = tuple(k.strip() for k in env.get(keys_env, "").split(",") if k.strip())
        if not keys:
            r.problem("clients.keys_env", f"environment variable {keys_env} is unset or empty")
        elif not all(HEADER_SAFE.fullmatch(k) for k in keys):
            r.problem("clients.keys_env", f"environment variable {keys_env} holds a key with a character "
                      "other than printable ASCII; no client could send it in a header")
    return Clients(keys_env=keys_env, keys=keys)


def parse_config(raw: Any, env: Mapping[str, str] | None = None, source: str = "<memory>") -> Config:
    """Validate a loaded YAML document; raise ConfigError naming every problem."""
    env = os.environ if env is None else env
    base = Path(source).parent if source != "<memory>" else Path.cwd()  # where a relative api_key_file is
    problems: list[str] = []
    r = Reader(problems)
    data = r.mapping(raw, "(top)", _TOP_KEYS)
    listen = r.string(data, "listen", "(top)", default(Config, "listen"))
    ops_listen = r.string(data, "ops_listen", "(top)", default(Config, "ops_listen"))
    for key, value in (("listen", listen), ("ops_listen", ops_listen)):
        if value is not None and (problem := listen_problem(value)) is not None:
            r.problem(key, problem)
    providers: dict[str, Provider] = {}
    for pname, praw in _named(r, data, "providers", "provider").items():
        provider = _provider(r, key_of(pname), praw, env, base)
        if provider is not None:
            providers[str(pname)] = provider
    routes: dict[str, Route] = {}
    for rname, rraw in _named(r, data, "routes", "route").items():
        route = _route(r, key_of(rname), rraw, providers)
        if route is not None:
            routes[str(rname)] = route
    clients = _clients(r, data.get("clients"), env)
    # Both sections' unknown keys before either's values, as the problems have always been listed.
    adata = r.mapping(data.get("access_log"), "access_log", tuple(_ACCESS_LOG))
    ldata = r.mapping(data.get("ledger"), "ledger", tuple(_LEDGER))
    config = Config(
        listen=listen, ops_listen=ops_listen,
        providers=providers,
        routes=routes,
        clients=clients,
        access_log=fill(r, AccessLog, adata, "access_log", _ACCESS_LOG),
        ledger=fill(r, Ledger, ldata, "ledger", _LEDGER),
        max_body_bytes=r.number(data, "max_body_bytes", "(top)", default(Config, "max_body_bytes"), low=1024,
                                integer=True),
        shutdown_grace=r.number(data, "shutdown_grace", "(top)", default(Config, "shutdown_grace"), low=0),
        connections=section(r, Connections, data.get("connections"), "connections", _CONNECTIONS),
        state=(state := read_state(r, data.get("state"), env)),
        workers=read_workers(r, data, state.redis),
        tracing=tracing_section(r, data.get("tracing")),
        source=source,
    )
    if problems:
        raise ConfigError(source, problems)
    return config


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
