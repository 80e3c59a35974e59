"""walk(): the only upstream I/O. Try the planned order until one target commits.

For each candidate the provider's adapter builds the call, the transport sends
it, and the outcome is classified by the one rule in ``classify.py``. The
tracker, breaker, limiter and history are fed here and only here. The commit
point is the first token of a 2xx answer (``providers/first_token.py``): before
it every failure, an error event inside a 200 included, may move on; after it
the walker hands the open call (a :class:`Lease`) to the relay.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import aiohttp

from ..config import Provider, Route, Target
from ..errors import error_body, error_type
from ..providers import Adapter, Call, adapter_for
from ..providers.anthropic_wire import TranslationError
from ..providers.base import StreamTranslator, UpstreamRequest
from ..providers.first_token import Ended, FirstToken, UpstreamError, error_in_body
from ..routing.decision import Attempt, Racer
from ..state import State, TargetState
from ..state.breaker import PROBE, WAIT
from ..state.limiter import Limiter
from ..state.tracker import BUFFERED, STREAMED
from .classify import (
    BUSY,
    INVALID_BODY,
    Outcome,
    classify_ended,
    classify_error,
    classify_exception,
    classify_status,
    is_json_object,
)
from .deadlines import Deadlines, Expired
from .transport import HttpTransport, SimTransport, Upstream

MAX_RETRY_AFTER = 30.0  # a longer hint abandons the target for now (it is cooled down)
MAX_ERROR_BODY = 64 * 1024
MAX_BUFFERED_BODY = 64 * 1024 * 1024
MAX_DRAIN = 64 * 1024  # read after a stream's end marker before giving up on the connection
BACKOFF_BASE = 0.05
BACKOFF_CAP = 2.0
NO_HEADERS: Mapping[str, str] = MappingProxyType({})
JSON_HEADERS: Mapping[str, str] = MappingProxyType({"content-type": "application/json"})
SKIPPED = Outcome("cooldown", True, 503, "breaker open or probing", counts=False)


@dataclass(slots=True, eq=False)
class Lease:
    """A committed upstream call, held until the relay has drained it."""

    target: Target
    provider: Provider
    adapter: Adapter
    upstream: Upstream
    first: bytes
    translator: StreamTranslator | None
    _ts: TargetState
    _limiter: Limiter | None
    _walker: Walker
    _route: Route
    started: float = 0.0
    idle: float = 60.0
    total: float = 600.0
    waiting_since: float | None = None  # the relay is waiting for the upstream since then
    expired: str | None = None  # why the deadline keeper cut it
    finished: bool = False

    def expire(self, reason: str) -> None:
        """Past its idle or total deadline: wake the relay's pending read with the reason."""
        self.expired = reason
        self.upstream.abort(Expired(reason))

    def finish_after_end(self) -> None:
        """The client has the whole answer (the stream's end marker came): read what the upstream
        still sends, its own end of body, in the background, then release.

        Releasing an unfinished body closes the connection instead of pooling it, and
        waiting for that end on the relay's path makes the client wait for it too."""
        if self.upstream.at_eof():
            self.finish()
            return
        self._walker.drain(self)

    def finish(self, failure: str | None = None) -> None:
        """Release the slot and the connection; a failure after commit counts against the target."""
        if self.finished:
            return
        self.finished = True
        self._walker.deadlines.forget(self)
        self.upstream.close()
        self._ts.in_flight -= 1
        if self._limiter is not None:
            self._limiter.release()
        if failure is not None:
            self._ts.history.append(False)
            self._ts.breaker.failure(self._walker.clock(), self._route.cooldown)


class _Waiting:
    """An attempt waiting for its first chunk, watched by the deadline sweeper.

    ``asyncio.timeout`` arms and cancels a loop timer per attempt, which measured
    as a noticeable share of a relayed call; the sweeper that already keeps idle
    and total deadlines (``proxy/walk/deadlines.py``) keeps this one too, and cancels
    the attempt's task when it passes. The walker turns that cancellation back
    into a timeout, exactly as ``asyncio.timeout`` would.
    """

    __slots__ = ("expired", "idle", "started", "task", "total", "waiting_since")

    def __init__(self, task: asyncio.Task[object], started: float, limit: float) -> None:
        self.task = task
        self.started = started
        self.total = limit
        self.idle = limit
        self.waiting_since: float | None = None
        self.expired = False

    def expire(self, reason: str) -> None:
        self.expired = True
        self.task.cancel()

    def timed_out(self) -> bool:
        """After a CancelledError: was it our deadline (and nobody else's cancel)?"""
        return self.expired and self.task.uncancel() == 0


class WalkResult:
    """What a walk ended with: filled in attempt by attempt."""

    __slots__ = ("attempts", "body", "headers", "lease", "outcome", "race", "served", "status")

    def __init__(self) -> None:
        self.attempts: list[Attempt] = []
        self.lease: Lease | None = None  # a committed answer (streamed or buffered)
        self.status = 502
        self.headers: Mapping[str, str] = NO_HEADERS
        self.body = b""  # the buffered answer, a client error as it is, or the final error
        self.outcome: Outcome | None = None  # why the walk ended without an answer
        self.race: tuple[Racer, ...] = ()  # the targets that ran side by side, when any did
        self.served: str | None = None  # the target whose 2xx answer this is


class Walker:
    def __init__(
        self,
        state: State,
        http: HttpTransport,
        sim: SimTransport | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        deadlines: Deadlines | None = None,
    ) -> None:
        self.state = state
        self.http = http
        self.sim = sim or SimTransport()
        self.clock = clock
        self.rng = rng or random.Random()
        self.deadlines = deadlines or Deadlines(clock)
        self._drains: set[asyncio.Task[None]] = set()

    def drain(self, lease: Lease) -> None:
        """Read a finished stream's tail in a task of its own (see ``Lease.finish_after_end``)."""
        self.keep(asyncio.get_running_loop().create_task(_drain(lease, self.clock)))

    def close(self) -> None:
        """Stop the drains still running (at shutdown their connections are closing anyway)."""
        for task in list(self._drains):
            task.cancel()

    def keep(self, task: asyncio.Task[Any]) -> None:
        """Hold a task that outlives its request (a drain, a racer still being measured) until it
        ends, so it is not collected midway and ``close`` can stop it."""
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)

    async def walk(self, route: Route, targets: tuple[Target, ...], call: Call,
                   providers: Mapping[str, Provider], *, rescued: str | None = None) -> WalkResult:
        """Try ``targets`` in order, one at a time; ``rescued`` names the one health kept although
        unhealthy. (A route with ``hedge`` is walked by ``race.py`` instead.)"""
        result = WalkResult()
        for target in targets:
            if await self.try_target(result, route, target, providers, call, target.name == rescued):
                return result
        return result

    async def try_target(self, result: WalkResult, route: Route, target: Target,
                         providers: Mapping[str, Provider], call: Call, rescue: bool,
                         stop: Callable[[], bool] | None = None) -> bool:
        """One target, with its retries; True when the walk is over (an answer or a client error).
        ``stop`` (a racer being measured: has another answered?) ends the retries early."""
        provider = providers[target.provider]
        adapter = adapter_for(provider.kind, call.op, provider.responses)
        try:
            request = adapter.build(provider, target, call)
        except TranslationError as exc:
            _untranslatable(result, target, exc)
            return False
        for n in range(target.retry + 1):
            outcome = await self._attempt(result, route, target, provider, adapter, call, request, rescue)
            if outcome is SKIPPED:
                return False
            if outcome is None:  # committed, or a client error returned as it is
                return True
            hint = outcome.retry_after
            if hint is not None and hint > MAX_RETRY_AFTER:
                return False
            if n < target.retry:
                if stop is not None and stop():
                    return False  # measured only, and another has answered: a retry buys no figure
                if hint is not None:
                    await asyncio.sleep(hint)
                else:
                    await asyncio.sleep(self.rng.uniform(0, min(BACKOFF_CAP, BACKOFF_BASE * 2**n)))
                if stop is not None and stop():
                    return False
        return False

    async def _attempt(self, result: WalkResult, route: Route, target: Target, provider: Provider,
                       adapter: Adapter, call: Call, request: UpstreamRequest,
                       rescue: bool = False) -> Outcome | None:
        """One try. Returns None when the walk is over (commit or client error), else the failure."""
        state = self.state
        ts = state.target(target.key)
        limiter = state.limiter(provider.name)
        transport = self.sim if provider.kind == "simulated" else self.http
        started = self.clock()
        admitted = ts.breaker.begin(started, rescue=rescue)
        if admitted == WAIT:
            self._skipped(result, target, ts, started)
            return SKIPPED
        probe = admitted == PROBE
        failure: UpstreamError | Ended | None = None
        acquired = False
        counted = False
        upstream: Upstream | None = None
        verdict = False  # the breaker heard a success or failure for this attempt
        task = asyncio.current_task()
        assert task is not None
        waiting = _Waiting(task, started, provider.timeouts.first_chunk)
        deadlines = self.deadlines
        deadlines.watch(waiting)
        try:
            try:
                try:
                    if limiter is not None:
                        await limiter.acquire()
                        acquired = True
                    ts.in_flight += 1
                    ts.buffering += not call.stream
                    counted = True
                    upstream = await transport.send(provider, request)
                    ok = 200 <= upstream.status < 300
                    if not ok:
                        first = await upstream.read(MAX_ERROR_BODY)
                    elif call.stream:
                        gate = adapter.first_token(call)
                        first = await upstream.chunk()  # most often it holds the first token
                        if not (gate.feed(first) if first else gate.end()):
                            await _first_token(upstream, gate)
                        first, failure = gate.held, gate.failure
                    else:
                        first = await upstream.chunk()
                        if not upstream.at_eof():
                            # The rest of a buffered body; its deadline is the provider's total.
                            waiting.total = provider.timeouts.total
                            first += await upstream.read(MAX_BUFFERED_BODY)
                        failure = error_in_body(first)
                except asyncio.CancelledError:
                    if waiting.timed_out():
                        raise TimeoutError("no first chunk before the deadline") from None
                    raise
                finally:
                    deadlines.forget(waiting)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Timing out while queued for our own limit is busy, not the provider's fault.
                queued = limiter is not None and not acquired and isinstance(exc, TimeoutError)
                outcome = BUSY if queued else classify_exception(exc)
                self._failed(result, route, target, ts, outcome, started)
                verdict = outcome.counts
                return outcome

            now = self.clock()
            status = upstream.status
            if ok and failure is not None:
                verdict = True
                return self._failed_before_token(result, route, target, ts, adapter, call, failure, started)
            if ok and not call.stream and not is_json_object(first):
                self._failed(result, route, target, ts, INVALID_BODY, started)  # not the success it claims
                verdict = True
                return INVALID_BODY
            if ok:
                ttfc = now - started
                state.tracker.record(target.key, ttfc, now, STREAMED if call.stream else BUFFERED)
                ts.breaker.success()
                ts.history.append(True)
                verdict = True
                result.attempts.append(Attempt(target.name, str(status), ttfc, False, ttfc))
                result.served = target.name
                result.status = status
                result.headers = upstream.headers
                if call.stream:
                    t = provider.timeouts
                    lease = result.lease = Lease(target, provider, adapter, upstream, first,
                                                 adapter.stream_translator(call, target), ts,
                                                 limiter if acquired else None, self, route,
                                                 started, t.idle, t.total)
                    self.deadlines.watch(lease)
                    upstream = None  # the lease owns it now, with the slot and the count
                    counted = acquired = False
                else:
                    result.body = adapter.translate_body(call, target, first)
                return None

            outcome = classify_status(status, upstream.headers,
                                      adapter.is_context_overflow(status, first))
            if not outcome.failover:
                # Another 4xx: the client's own mistake, returned as it is; says nothing of health.
                result.attempts.append(Attempt(target.name, outcome.word, now - started))
                result.status = status
                result.headers = upstream.headers
                result.body = adapter.client_error(call, status, first)
                result.outcome = outcome
                return None
            self._failed(result, route, target, ts, outcome, started,
                         adapter.error_body(status, first))
            verdict = True
            return outcome
        finally:
            if upstream is not None:
                upstream.close()
            if counted:
                ts.in_flight -= 1
                ts.buffering -= not call.stream
            if acquired and limiter is not None:
                limiter.release()
            if probe and not verdict:
                ts.breaker.abandon_probe()

    def _failed_before_token(self, result: WalkResult, route: Route, target: Target, ts: TargetState,
                             adapter: Adapter, call: Call, failure: UpstreamError | Ended,
                             started: float) -> Outcome | None:
        """A 2xx that failed before its first token, classified like its HTTP twin: an invalid
        request goes back to the client (None: the walk is over), anything else moves on."""
        if isinstance(failure, Ended):
            outcome = classify_ended(failure)
            self._failed(result, route, target, ts, outcome, started)
            return outcome
        overflow = adapter.is_context_overflow(400, failure.body)
        outcome = classify_error(failure, "event" if call.stream else "body", overflow)
        body = adapter.error_body(outcome.status, failure.body)
        if outcome.failover:
            self._failed(result, route, target, ts, outcome, started, body)
            return outcome
        result.attempts.append(Attempt(target.name, outcome.word, self.clock() - started))
        result.status = outcome.status
        result.headers = JSON_HEADERS
        result.body = adapter.client_error(call, outcome.status, body)
        result.outcome = outcome
        return None

    def _skipped(self, result: WalkResult, target: Target, ts: TargetState, now: float) -> None:
        """The breaker opened (or its probe left) after planning: move on without calling it."""
        result.attempts.append(Attempt(target.name, "cooldown", 0.0, True))
        if result.outcome is None:  # otherwise the last upstream error stays the answer
            reason = ts.breaker.health(now).reason
            result.status = 503
            result.headers = NO_HEADERS
            result.body = error_body(f"{target.name}: {reason}", error_type(503), code="cooldown")

    def _failed(self, result: WalkResult, route: Route, target: Target, ts: TargetState,
                outcome: Outcome, started: float, body: bytes | None = None) -> None:
        now = self.clock()
        result.attempts.append(Attempt(target.name, outcome.word, now - started, True))
        if outcome.counts:
            ts.history.append(False)
            ts.breaker.failure(now, route.cooldown)
        if outcome.retry_after is not None:
            ts.breaker.cool(now + outcome.retry_after)
        result.outcome = outcome
        result.status = outcome.status
        result.headers = NO_HEADERS
        if body is None:
            body = error_body(f"{target.name}: {outcome.message}", error_type(outcome.status),
                              code=outcome.word.replace(" ", "_"))
        result.body = body


async def _first_token(upstream: Upstream, gate: FirstToken) -> None:
    """Read a 2xx stream on until its first token (the commit point, docs/adr/0007), holding
    back the events before it, until the gate has decided: committed or failed."""
    read = upstream.chunk
    decided = False
    while not decided:
        data = await read()
        decided = gate.feed(data) if data else gate.end()


UNTRANSLATABLE = Outcome("untranslatable", False, 400, "no faithful equivalent in this target's API")


async def _drain(lease: Lease, clock: Callable[[], float]) -> None:
    """Up to ``MAX_DRAIN`` bytes after the end marker, each read under the lease's idle and
    total deadlines. More than that, a stall or a cut only costs the connection: the client's
    answer was whole, so the target is not blamed."""
    left = MAX_DRAIN
    try:
        lease.waiting_since = clock()
        while data := await lease.upstream.chunk():
            left -= len(data)
            if left < 0:
                break
    except (TimeoutError, aiohttp.ClientError, OSError):
        pass
    finally:
        lease.finish()


def _untranslatable(result: WalkResult, target: Target, exc: TranslationError) -> None:
    """A request this target's API cannot carry faithfully: record it and move on, without
    counting against the target (the request, not the provider, is the cause). When no later
    target answers, the client gets this 400 and its reason."""
    result.attempts.append(Attempt(target.name, UNTRANSLATABLE.word, 0.0))
    result.status = 400
    result.headers = {"content-type": "application/json"}
    result.body = error_body(f"{target.name}: {exc}", "invalid_request_error", code="untranslatable")
    result.outcome = UNTRANSLATABLE
