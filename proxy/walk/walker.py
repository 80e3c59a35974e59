"""walk(): the only upstream I/O. Try the planned order until one target commits.

Each attempt is three steps. *Admit*: the breaker's word (a target that opened since the
plan is skipped) and a :class:`~proxy.walk.slot.Slot`. *Send*: take the slot under the
provider's limit, send through the provider kind's transport, and read up to the commit
point, the first token of a 2xx answer (``translate/first_token.py``). *Settle*: classify
what came back by the one rule in ``classify.py`` and tell the state through its named
methods (``State.first_token``, ``failed``, ``cool``: the one door, docs/adr/0016). Before the
commit every failure, an error event inside a 200 included,
may move on; after it the walker hands the open call (a :class:`~proxy.walk.lease.Lease`)
to the relay. The slot goes back when the attempt ends, or with the lease.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..config import Provider, Route, Target
from ..egress import forward_headers
from ..errors import error_body
from ..providers import Adapter, Call, adapter_for
from ..providers.base import StreamTranslator, UpstreamRequest
from ..routing.decision import Attempt
from ..scrub import Scrubber
from ..state import State, TargetState
from ..state.breaker import PROBE, WAIT
from ..state.tracker import BUFFERED
from ..translate.chat_to_anthropic import TranslationError
from ..translate.first_token import Ended, FirstToken, UpstreamError, error_in_body, scrubbed
from ..upstream.transport import Transport, Upstream
from .answer import buffered_answer, stream_opening
from .classify import BUSY, Outcome, classify_ended, classify_error, classify_exception, classify_status
from .deadlines import Countdown, Deadlines
from .lease import Background, Lease
from .limiter import Limiters
from .result import JSON_HEADERS, NO_HEADERS, Trail, Walked
from .slot import Slot

__all__ = ["Walker"]

MAX_RETRY_AFTER = 30.0  # a longer hint abandons the target for now (it is cooled down)
MAX_ERROR_BODY = 64 * 1024
MAX_BUFFERED_BODY = 64 * 1024 * 1024
BACKOFF_BASE = 0.05
BACKOFF_CAP = 2.0
SKIPPED = Outcome("cooldown", True, 503, "breaker open or probing", counts=False)
UNTRANSLATABLE = Outcome("untranslatable", False, 400, "no faithful equivalent in this target's API")


class _Waiting(Countdown):
    """An attempt waiting for its first chunk, watched by the deadline sweeper.

    ``asyncio.timeout`` arms and cancels a loop timer per attempt, which measured
    as a noticeable share of a relayed call; the sweeper that already keeps idle
    and total deadlines (``proxy/walk/deadlines.py``) keeps this one too, and cancels
    the attempt's task when it passes. The walker turns that cancellation back
    into a timeout, exactly as ``asyncio.timeout`` would.
    """

    __slots__ = ("expired", "task")

    def __init__(self, task: asyncio.Task[object], started: float, limit: float) -> None:
        # Countdown's fields set here, not by calling its __init__: this is built per attempt.
        self.started = started
        self.total = limit
        self.idle = limit
        self.waiting_since: float | None = None
        self.task = task
        self.expired = False

    def expire(self, reason: str) -> None:
        self.expired = True
        self.task.cancel()

    def timed_out(self) -> bool:
        """After a CancelledError: was it our deadline (and nobody else's cancel)?"""
        return self.expired and self.task.uncancel() == 0


class _Aim:
    """One target of one walk, with what every try on it shares (built once per target)."""

    __slots__ = ("adapter", "call", "provider", "request", "rescue", "route", "target", "transport")

    def __init__(self, route: Route, target: Target, provider: Provider, adapter: Adapter, call: Call,
                 request: UpstreamRequest, transport: Transport, rescue: bool) -> None:
        self.route = route
        self.target = target
        self.provider = provider
        self.adapter = adapter
        self.call = call
        self.request = request
        self.transport = transport
        self.rescue = rescue


class Walker:
    def __init__(
        self,
        state: State,
        transports: Mapping[str, Transport],
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        deadlines: Deadlines | None = None,
        limiters: Limiters,
        scrubber: Scrubber | None = None,
    ) -> None:
        """``transports``: one per provider kind, picked where the gateway is built; ``limiters``: the
        gateway's, configured with it (required: a walker without them would ignore max_concurrent);
        ``scrubber``: the gateway's, which every upstream failure passes in ``_settle``."""
        self.state = state
        self.scrubber = scrubber or Scrubber()
        self.limiters = limiters
        self.transports = transports
        self.clock = clock
        self.rng = rng or random.Random()
        self.deadlines = deadlines or Deadlines(clock)
        self.background = Background()

    def close(self) -> None:
        """Stop the drains and measured racers still running."""
        self.background.close()

    def keep(self, task: asyncio.Task[Any]) -> None:
        """Hold a task that outlives its request until it ends (see :class:`Background`)."""
        self.background.keep(task)

    async def walk(self, route: Route, targets: tuple[Target, ...], call: Call,
                   providers: Mapping[str, Provider], *, rescued: str | None = None) -> Walked:
        """Try ``targets`` in order, one at a time; ``rescued`` names the one health kept although
        unhealthy. (A route with ``hedge`` is walked by ``race.py`` instead.)"""
        trail = Trail()
        for target in targets:
            if await self.try_target(trail, route, target, providers, call, target.name == rescued):
                break
        return trail.result(tuple(trail.attempts))

    async def try_target(self, trail: Trail, route: Route, target: Target,
                         providers: Mapping[str, Provider], call: Call, rescue: bool,
                         stop: Callable[[], bool] | None = None) -> bool:
        """One target, with its retries; True when the walk is over (an answer or a client error).
        ``stop`` (a racer being measured: has another answered?) ends the retries early."""
        provider = providers[target.provider]
        adapter = adapter_for(provider.kind, call.op, provider.responses)
        try:
            request = adapter.build(provider, target, call)
        except TranslationError as exc:
            # The request, not the provider, is the cause: move on without counting against it.
            # When no later target answers, the client gets this 400 and its reason.
            # The message is the client's to act on: the target's name is in x-route-decision.
            trail.ended(Attempt(target.name, UNTRANSLATABLE.word, 0.0), UNTRANSLATABLE, 400, JSON_HEADERS,
                        error_body(exc.message, "invalid_request_error", code="untranslatable", param=exc.param))
            return False
        aim = _Aim(route, target, provider, adapter, call, request, self.transports[provider.kind], rescue)
        for n in range(target.retry + 1):
            outcome = await self._attempt(trail, aim)
            if outcome is SKIPPED:
                return False
            if outcome is None:  # committed, or a client error returned as it is
                return True
            hint = outcome.retry_after
            if hint is not None and hint > min(MAX_RETRY_AFTER, provider.timeouts.first_chunk):
                # Abandoned for now (it is cooled down): a wait longer than the whole first-token
                # budget before even asking again is not what a retry was configured for.
                return False
            if n < target.retry:
                if stop is not None and stop():
                    return False  # measured only, and another has answered: a retry buys no figure
                await asyncio.sleep(hint if hint is not None else self._backoff(n))
                if stop is not None and stop():
                    return False
        return False

    def _backoff(self, n: int) -> float:
        return self.rng.uniform(0, min(BACKOFF_CAP, BACKOFF_BASE * 2**n))

    # kept whole: a coroutine of its own for the send step is one more frame on every resume of the
    # request's task, measured with callgrind (the docstring; docs/history/2026-12-03.md)
    async def _attempt(self, trail: Trail, aim: _Aim) -> Outcome | None:
        """One try: admit, send, settle. None when the walk is over (commit or client error),
        else the failure. The slot goes back here, unless a lease took it.

        The send step runs inline, not in a coroutine of its own: every resume of the request's
        task passes through each frame of its await chain, and one more measured (callgrind)."""
        started = self.clock()
        provider, call = aim.provider, aim.call
        request = aim.request if call.trace is None else call.trace.attempt(aim.target.name, started, aim.request)
        slot = self._admit(trail, aim, started)
        if slot is None:
            return SKIPPED
        task = asyncio.current_task()
        assert task is not None
        waiting = _Waiting(task, started, provider.timeouts.first_chunk)
        watched = self.deadlines.calls  # the sweeper looks at this set; an attempt is in it until settled
        watched.add(waiting)
        ended: Outcome | Lease | None
        ready: tuple[StreamTranslator, dict[str, str]] | None = None
        try:
            try:
                try:
                    if slot.limiter is not None:
                        await slot.queue()  # and counts in flight; without a limit, the slot did
                    upstream = slot.upstream = await aim.transport.send(provider, request)
                    if not 200 <= upstream.status < 300:
                        first, failure = await upstream.read(MAX_ERROR_BODY), None
                    elif call.stream:
                        gate = aim.adapter.first_token(call)
                        # Built while the upstream thinks, not after its first token: the translator
                        # and the upstream's headers a client may see (egress.py), for the commit.
                        ready = (aim.adapter.stream_translator(call, aim.target),
                                 forward_headers(upstream.headers, NO_HEADERS, self.scrubber))
                        if call.meanwhile is not None:
                            call.meanwhile()
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
                    watched.discard(waiting)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                ended = self._raised(trail, aim, slot, exc, started)
            else:
                ended = self._settle(trail, aim, slot, first, failure, started, ready)
        except BaseException:
            slot.release()
            raise
        if isinstance(ended, Lease):
            return None
        slot.release()
        return ended

    def _admit(self, trail: Trail, aim: _Aim, now: float) -> Slot | None:
        """The breaker's word on this try: a target that opened (or whose probe left) since the
        plan is skipped without a call."""
        state = self.state
        ts = state.target(aim.target.key)
        admitted = state.admit(ts, now, rescue=aim.rescue)
        if admitted == WAIT:
            trail.skipped(aim.target.name, ts.breaker.health(now).reason)
            return None
        return Slot(state, ts, self.limiters.get(aim.provider.name), admitted == PROBE, not aim.call.stream)

    def _raised(self, trail: Trail, aim: _Aim, slot: Slot, exc: Exception, started: float) -> Outcome:
        """The send step raised. Timing out while queued for our own limit is busy, not the
        provider's fault."""
        outcome = BUSY if slot.queued() and isinstance(exc, TimeoutError) else classify_exception(exc)
        self._failed(trail, aim, slot.ts, outcome, started)
        slot.heard = outcome.counts
        return outcome

    def _settle(self, trail: Trail, aim: _Aim, slot: Slot, first: bytes, failure: UpstreamError | Ended | None,
                started: float, ready: tuple[StreamTranslator, dict[str, str]] | None = None
                ) -> Outcome | Lease | None:
        """Classify what came back and feed the state: a commit (a Lease for a stream, None for a
        buffered answer), a client error returned as it is (None), or a failure to move on from.
        Every upstream failure passes the scrubber here first. ``ready``: a 2xx stream's translator
        and client headers, built at its head."""
        now = self.clock()
        upstream = slot.upstream
        assert upstream is not None
        status = upstream.status
        # The one door for an upstream's words before the commit (proxy/scrub.py): whatever it said
        # instead of an answer is scrubbed here, whole, before it is classified, normalised or cut.
        if not 200 <= status < 300:
            return self._refused(trail, aim, slot, self.scrubber.error_body(first), started, now)
        if failure is not None:
            failure = scrubbed(failure, self.scrubber)
        slot.heard = True
        if failure is not None:
            return self._failed_before_token(trail, aim, slot, failure, started)
        target, call = aim.target, aim.call
        # Not the answer it claims (answer.py): a failure, counted, not the success its status says.
        answer: bytes | tuple[bytes, Exception | None] | Outcome
        if call.stream:
            assert ready is not None
            translator, client_headers = ready
            answer = stream_opening(translator, first, self.scrubber)
        else:
            answer = buffered_answer(aim.adapter, call, target, first)
        if isinstance(answer, Outcome):
            self._failed(trail, aim, slot.ts, answer, started)
            return answer
        ttfc = now - started
        attempt = Attempt(target.name, str(status), ttfc, False, ttfc)
        if isinstance(answer, bytes):
            self.state.first_token(slot.ts, ttfc, now, BUFFERED, slot.load)
            trail.answered(attempt, status, upstream.headers, answer)
            return None
        t = aim.provider.timeouts
        opening, broken = answer
        # The state hears the sample once the client has the opening (Lease.committed): off its path.
        lease = Lease(target, upstream, opening, translator, slot, started, t.idle, t.total, self.clock,
                      self.deadlines, self.background, aim.route.cooldown, broken=broken, sample=(ttfc, now))
        self.deadlines.calls.add(lease)  # the stream's idle and total deadlines, swept from here on
        trail.answered(attempt, status, client_headers, lease=lease)
        return lease

    def _refused(self, trail: Trail, aim: _Aim, slot: Slot, body: bytes, started: float,
                 now: float) -> Outcome | None:
        """A non-2xx status: failover-safe ones move on, any other 4xx is the client's own mistake,
        returned as it is, and says nothing of the target's health."""
        adapter, upstream = aim.adapter, slot.upstream
        assert upstream is not None
        status = upstream.status
        outcome = classify_status(status, upstream.headers, adapter.is_context_overflow(status, body),
                                  aim.route.fail_over_on)
        if not outcome.failover:
            # The body goes back in the client's JSON shape, whatever the upstream sent (a proxy's
            # text/plain 413): its other headers go along, its content type does not.
            headers = {k: v for k, v in upstream.headers.items() if k.lower() != "content-type"}
            headers["content-type"] = "application/json"
            trail.ended(Attempt(aim.target.name, outcome.word, now - started), outcome, status, headers,
                        adapter.client_error(aim.call, status, body))
            return None
        # A status the outcome changes (a provider's 401 is the client's 502) gets the outcome's message.
        self._failed(trail, aim, slot.ts, outcome, started,
                     adapter.error_body(status, body) if outcome.status == status else None)
        slot.heard = True
        return outcome

    def _failed_before_token(self, trail: Trail, aim: _Aim, slot: Slot, failure: UpstreamError | Ended,
                             started: float) -> Outcome | None:
        """A 2xx that failed before its first token, classified like its HTTP twin: an invalid
        request goes back to the client (None: the walk is over), anything else moves on."""
        if isinstance(failure, Ended):
            outcome = classify_ended(failure)
            self._failed(trail, aim, slot.ts, outcome, started)
            return outcome
        adapter, call = aim.adapter, aim.call
        overflow = adapter.is_context_overflow(400, failure.body)
        outcome = classify_error(failure, "event" if call.stream else "body", overflow)
        body = adapter.error_body(outcome.status, failure.body)
        if outcome.failover:
            self._failed(trail, aim, slot.ts, outcome, started, body)
            return outcome
        trail.ended(Attempt(aim.target.name, outcome.word, self.clock() - started), outcome, outcome.status,
                    JSON_HEADERS, adapter.client_error(call, outcome.status, body))
        return None

    def _failed(self, trail: Trail, aim: _Aim, ts: TargetState, outcome: Outcome, started: float,
                body: bytes | None = None) -> None:
        """A failure to move on from: counted against the target (when it counts), and cooled
        down for its Retry-After."""
        now = self.clock()
        trail.failed(Attempt(aim.target.name, outcome.word, now - started, True), outcome, body)
        if outcome.counts:
            self.state.failed(ts, now, aim.route.cooldown, outcome.word)
        if outcome.retry_after is not None:
            self.state.cool(ts, now + outcome.retry_after, now)


async def _first_token(upstream: Upstream, gate: FirstToken) -> None:
    """Read a 2xx stream on until its first token (the commit point, docs/adr/0007), holding
    back the events before it, until the gate has decided: committed or failed."""
    read = upstream.chunk
    decided = False
    while not decided:
        data = await read()
        decided = gate.feed(data) if data else gate.end()
