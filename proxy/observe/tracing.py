"""OpenTelemetry traces from finished exchanges: one span per request, a child per attempt.

Spans are built after the answer, like every observer's work, from the Decision and the ids the
request path chose (``proxy/traceparent.py``: the attempt span ids are the ones its upstream
already saw in ``traceparent``), with their real start and end times, and encoded at once into
OTLP protobuf (``otlp.py``). A task the observer owns posts them in batches every half second
over OTLP/HTTP; a slow or dead collector fills a bounded queue and spans are dropped, while no
request waits for anything (docs/adr/0012).

Names and attributes follow the OpenTelemetry GenAI semantic conventions (``gen_ai.*``):
the request span is ``{operation} {route}`` (kind server), an attempt ``{operation} {upstream
model}`` (kind client) with its provider; the routing record rides along as ``firstbyte.*``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version

import aiohttp
from yarl import URL

from ..config import Config, Tracing
from ..routing.decision import RACE_WORDS, Attempt, Decision
from ..traceparent import TraceContext
from . import Finished
from .otlp import CLIENT, ERROR, SERVER, attr, export_request, known, scope, seconds, span

__all__ = ["Traces"]

log = logging.getLogger("firstbyte")

EXPORT_TIMEOUT = 5.0  # seconds one export may take
CLOSE_WAIT = 2.0  # seconds a stop waits for the last spans to go out
EVERY = 0.5  # seconds between exports
BATCH = 512  # spans per export at most
WARN_EVERY = 60.0  # seconds between two warnings about a collector that fails
# firstbyte's operations as gen_ai.operation.name says them
OPERATIONS = {"chat": "chat", "messages": "chat", "responses": "chat", "completions": "text_completion",
              "embeddings": "embeddings"}
PROVIDERS = {"openai": "openai", "anthropic": "anthropic", "azure": "azure.ai.openai",
             "simulated": "firstbyte.simulated"}
_NS = 1_000_000_000


def _version() -> str:
    try:
        return version("firstbyte")
    except PackageNotFoundError:  # pragma: no cover - run from a tree that was not installed
        return "0"


class Traces:
    """Observer: finished exchanges with a sampled trace become OTLP spans, posted by its own task."""

    def __init__(self, tracing: Tracing, config: Config | None = None) -> None:
        self.tracing = tracing
        self.url = tracing.otlp or ""
        self.queue: deque[bytes] = deque()
        self.dropped = 0  # spans the full queue turned away
        self.failed = 0  # spans whose export failed
        self._resource = attr("service.name", tracing.service_name, 1)
        self._scope = scope("firstbyte", _version())
        self._targets: dict[str, tuple[str, bytes]] = {}  # target: (upstream model, its fixed attributes)
        self._task: asyncio.Task[None] | None = None  # kept: a bare task may be collected
        self._warned = 0.0
        if config is not None:
            self.reconfigure(config)

    def reconfigure(self, config: Config) -> None:
        """Each target's upstream model and the attributes that never change for it, encoded once."""
        targets: dict[str, tuple[str, bytes]] = {}
        for route in config.routes.values():
            for t in route.targets:
                if t.name in targets:
                    continue
                provider = config.providers[t.provider]
                system = PROVIDERS.get(provider.kind, provider.kind)
                fixed = (attr("gen_ai.request.model", t.model) + attr("gen_ai.provider.name", system)
                         + attr("gen_ai.system", system) + attr("firstbyte.target", t.name))
                if provider.base_url:
                    url = URL(provider.base_url)
                    fixed += attr("server.address", url.host or "") + attr("server.port", url.port or 0)
                targets[t.name] = (t.model, fixed)
        self._targets = targets

    def on_finished(self, finished: Finished) -> None:
        ctx = finished.trace
        if ctx is None or not ctx.sampled:
            return
        start = int(finished.started * _NS)
        end = start + int(finished.total * _NS)
        trace_id = ctx.trace_id.to_bytes(16, "big")
        d = finished.decision
        usage = b"" if d is None else _usage(d)
        out = [self._request_span(finished, ctx, trace_id, start, end, usage)]
        if d is not None:
            for attempt, span_id, began in _paired(d, ctx):
                t0 = start if began is None else start + int((began - ctx.t0) * _NS)
                out.append(self._attempt_span(finished, d, ctx, trace_id, attempt, span_id, t0, end, usage))
        room = self.tracing.queue - len(self.queue)
        if room < len(out):
            self.dropped += len(out)
            return
        self.queue.extend(out)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="firstbyte-traces")

    def _request_span(self, f: Finished, ctx: TraceContext, trace_id: bytes, start: int, end: int,
                      usage: bytes) -> bytes:
        d = f.decision
        op = OPERATIONS.get(f.operation, f.operation or "chat")
        route = d.route if d is not None else (f.asked or "")
        a = (known("gen_ai.operation.name", op) + known("gen_ai.request.model", route)
             + known("http.request.method", f.method) + known("url.path", f.path)
             + known("http.response.status_code", f.status) + known("firstbyte.stream", f.stream))
        if d is not None:
            a += (known("firstbyte.route", d.route) + known("firstbyte.strategy", d.strategy)
                  + attr("firstbyte.request_id", d.id) + attr("firstbyte.decision", d.header())
                  + _names("firstbyte.order", tuple(r.name for r in d.order))
                  + known("firstbyte.first_reason", d.first_reason) + known("firstbyte.failovers", d.failovers)
                  + usage)
            if d.excluded:
                a += attr("firstbyte.excluded", [f"{e.name}({e.reason})" for e in d.excluded])
            if d.served:
                a += known("firstbyte.served", d.served)
        if f.ttfc is not None:
            a += seconds("firstbyte.time_to_first_byte_s", f.ttfc)
        status = None
        if f.status >= 400:
            a += known("error.type", f.error or str(f.status))
            if f.status >= 500:  # a server span's error: the gateway's, not the client's
                status = (ERROR, f.error or str(f.status))
        return span(trace_id, ctx.span_id, ctx.parent_id, f"{op} {route}", SERVER, start, end, a, status,
                    ctx.tracestate)

    def _attempt_span(self, f: Finished, d: Decision, ctx: TraceContext, trace_id: bytes, a: Attempt, span_id: int,
                      start: int, request_end: int, usage: bytes) -> bytes:
        model, fixed = self._targets.get(a.name, ("", attr("firstbyte.target", a.name)))
        op = OPERATIONS.get(f.operation, f.operation or "chat")
        b = (known("gen_ai.operation.name", op) + fixed + known("firstbyte.attempt.outcome", a.outcome)
             + known("firstbyte.attempt.failover", a.failover))
        if a.outcome.isdigit():
            b += known("http.response.status_code", int(a.outcome))
        if a.ttfc is not None:
            b += seconds("firstbyte.time_to_first_token_s", a.ttfc)
        for name, role in d.race:
            if name == a.name:
                b += known("firstbyte.race.role", role)
                break
        served = a.name == d.served and a.ttfc is not None
        # a racer's end (lost, measured…) is no failure; a status from 400 up and a failure word are
        failed = int(a.outcome) >= 400 if a.outcome.isdigit() else a.outcome not in RACE_WORDS
        if served:
            b += known("gen_ai.response.model", model or a.name) + usage
        elif failed:
            b += known("error.type", a.outcome)
        # The served attempt goes on until the answer has been relayed; the others end when settled.
        end = max(request_end, start) if served else start + int(a.seconds * _NS)
        return span(trace_id, span_id, ctx.span_id, f"{op} {model or a.name}", CLIENT, start, end, b,
                    (ERROR, a.outcome) if failed else None, ctx.tracestate)

    async def _run(self) -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
            while True:
                await asyncio.sleep(EVERY)
                while self.queue:
                    await self._send(session)

    async def _send(self, session: aiohttp.ClientSession) -> None:
        """One batch to the collector; a failure drops it (with a warning at most once a minute)."""
        batch = [self.queue.popleft() for _ in range(min(BATCH, len(self.queue)))]
        body = export_request(self._resource, self._scope, batch)
        problem = None
        try:
            async with session.post(self.url, data=body, headers={"content-type": "application/x-protobuf"},
                                    timeout=aiohttp.ClientTimeout(total=EXPORT_TIMEOUT)) as r:
                await r.read()
                if r.status >= 300:
                    problem = f"answered {r.status}"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
        if problem is not None:
            self.failed += len(batch)
            now = time.monotonic()
            if now - self._warned >= WARN_EVERY:
                self._warned = now
                log.warning("tracing: the collector at %s %s; %d spans dropped so far", self.url, problem,
                            self.failed + self.dropped)

    async def close(self) -> None:
        """Send what is queued, waiting at most CLOSE_WAIT: a dead collector does not hold up a stop."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if not self.queue:
            return
        try:
            async with asyncio.timeout(CLOSE_WAIT), aiohttp.ClientSession() as session:
                while self.queue:
                    await self._send(session)
        except TimeoutError:
            log.warning("tracing: the collector at %s did not take the last spans in %.0fs", self.url, CLOSE_WAIT)


def _usage(d: Decision) -> bytes:
    out = b""
    for ours, theirs in (("prompt_tokens", "gen_ai.usage.input_tokens"),
                         ("completion_tokens", "gen_ai.usage.output_tokens")):
        count = d.usage.get(ours)
        if isinstance(count, int):
            out += known(theirs, count)
    return out


@functools.lru_cache(maxsize=1024)
def _names(key: str, names: tuple[str, ...]) -> bytes:
    """An order of targets: a route's few orders, encoded once each."""
    return attr(key, names)


def _paired(d: Decision, ctx: TraceContext) -> Iterator[tuple[Attempt, int, float | None]]:
    """Each attempt of the decision with the span id and start the walker gave it: by target, in
    order (one target's tries are sequential, whatever races beside them). An attempt the walker
    never started (a request the target's API cannot express) gets a new id and no start."""
    started: dict[str, deque[tuple[int, float]]] = {}
    for name, span_id, began in ctx.attempts:
        started.setdefault(name, deque()).append((span_id, began))
    for a in d.attempts:
        mine = started.get(a.name)
        if mine:
            span_id, began = mine.popleft()
            yield a, span_id, began
        else:
            yield a, ctx.new_span_id(), None
