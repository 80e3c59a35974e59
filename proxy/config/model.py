"""The shape of a loaded routes.yaml: frozen records and the one place their defaults are written.

The reader (``reader.py``) takes every default it needs from these dataclasses, so a default
changes here and nowhere else. Nothing here reads files or the environment.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

__all__ = [
    "AZURE_API_VERSION",
    "DEFAULT_STRATEGY",
    "KINDS",
    "MODEL_IN_PATH",
    "SIGNALS",
    "STRATEGIES",
    "AccessLog",
    "Clients",
    "Config",
    "Connections",
    "Cooldown",
    "Fastest",
    "Hedge",
    "Ledger",
    "Price",
    "Provider",
    "Route",
    "ScoreWeights",
    "Simulate",
    "StateLink",
    "Target",
    "TargetKey",
    "Timeouts",
    "Tracing",
    "path_segment_problem",
    "split_listen",
]

KINDS = ("openai", "anthropic", "simulated", "azure")
MODEL_IN_PATH = ("azure",)  # kinds whose upstream model is a segment of the request's URL path
STRATEGIES = ("ordered", "weighted", "fastest", "cheapest", "score")
DEFAULT_STRATEGY = "ordered"  # a route that names none
SIGNALS = ("ewma", "p50")
AZURE_API_VERSION = "2024-10-21"  # the latest GA api-version of Azure OpenAI's data plane

_SEGMENT = re.compile(r"[A-Za-z0-9._-]+")


def path_segment_problem(model: str) -> str | None:
    """Why ``model`` cannot be one segment of an upstream URL path, or None. Letters, digits and
    ``. _ -`` only, and not ``.`` or ``..``: a dot segment climbs the path once a URL library or
    the upstream normalises it (``/deployments/../chat`` is ``/chat``), and a slash, backslash or
    percent sign is a second segment or a dot segment to any upstream that decodes before it routes."""
    if _SEGMENT.fullmatch(model) is None:
        return "may hold only letters, digits, '.', '_' and '-' (it is a segment of the upstream URL path)"
    if not model.strip("."):
        return "is a dot segment, which would climb the upstream URL path"
    return None


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
    api_key_file: str | None = None  # read at load (and on reload): systemd's $CREDENTIALS_DIRECTORY
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
        return (self.api_key_env is None and self.api_key_file is None) or bool(self.api_key)


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
    # move a figure along the target's own fitted time-against-load line (docs/adr/0008); None: the
    # reader's default, on for a route with ``hedge``
    load_fit: bool | None = None


@dataclass(frozen=True, slots=True)
class Hedge:
    """Race the next target for the first token (docs/adr/0008)."""

    after_secs: float | None = None  # a fixed delay, or
    after_percentile: int | None = 90  # the leading target's own pNN of first-token samples
    max_extra: float = 0.1  # at most this share of the route's requests start a second attempt
    explore: bool = True  # exploring and measuring race the leader instead of replacing it
    refresh_secs: float = 0.3  # under a race, a target not measured for this long is explored
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
    fail_over_on: tuple[int, ...] = ()  # more upstream statuses that move on (and count), e.g. 404

    def __post_init__(self) -> None:
        if self.fastest.load_fit is None:  # unset: on under a race (docs/adr/0008), off as before without one
            object.__setattr__(self, "fastest", replace(self.fastest, load_fit=self.hedge is not None))

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
class StateLink:
    """``state:``: where the fleet's instances share what they learn (docs/adr/0016). No ``redis``:
    one process keeps everything in memory. The password comes from ``password_env``, never the file."""

    redis: str | None = None  # redis://HOST:PORT/DB or rediss:// (TLS)
    fleet: str = "firstbyte"  # every key is prefixed with it: two fleets on one Redis never mix
    password_env: str | None = None
    password: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class Clients:
    keys_env: str | None = None
    keys: tuple[str, ...] = field(default=(), repr=False)


@dataclass(frozen=True, slots=True)
class Connections:
    """Client connections on the listeners: how long one may take, and how many may be open.

    A connection has ``header_timeout`` from its opening (or from the first byte of its next
    request) to send a whole request head, and ``body_timeout`` from then to send the body;
    between requests it may idle ``keepalive_timeout``. A response the client takes no byte of
    for ``send_timeout`` (it stopped reading) is cut, freeing its upstream call. At ``max`` open
    connections the one idle longest between requests is closed for a new one; with none idle, a
    new one is answered 503 and closed. They take effect on restart, like ``listen``."""

    max: int = 4096
    header_timeout: float = 10.0
    body_timeout: float = 60.0
    keepalive_timeout: float = 15.0
    send_timeout: float = 30.0


@dataclass(frozen=True, slots=True)
class Tracing:
    """OpenTelemetry traces (``tracing:``): spans go by OTLP/HTTP to
    ``otlp`` (a collector's ``/v1/traces``). ``sample`` is the share of new traces kept; a
    request that arrives with a ``traceparent`` follows its caller's choice. Its default, 0.1,
    keeps tracing's cost within 5 % of a call; every request traced costs about 15 % (docs/adr/0012)."""

    otlp: str | None = None
    sample: float = 0.1
    service_name: str = "firstbyte"
    queue: int = 2048  # spans held for the exporter; more are dropped, never waited for
    export_every: float = 0.5  # seconds a span waits at most to be posted; a full batch goes at once


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
    state: StateLink = StateLink()
    workers: int = 1  # processes on the listen address (proxy/supervisor.py); 1 = this process alone
    tracing: Tracing | None = None  # None: no traces (the default)
    source: str = "<memory>"

    def target_keys(self) -> set[TargetKey]:
        return {t.key for route in self.routes.values() for t in route.targets}


def split_listen(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)

