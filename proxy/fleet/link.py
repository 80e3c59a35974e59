"""The fleet link: this instance's state shared with the others' through Redis, off the request path.

State's door hands every change to ``hear`` (a deque append: nothing awaits); a publisher task
sends what gathered as one stream entry on the heartbeat's tick (every HEARTBEAT, on the wall
clock's grid, so the fleet's entries of one tick reach a reader together), and at once for an
urgent event; a reader task blocks on the stream and folds in the other instances' entries, and
the probe task claims the fleet's one half-open probe per target (``probes.py``). On start the
stream's tail is folded in before the instance says it is ready (warm start); both it and the
catch-up after a drop read a bounded tail and fold it a slice at a time (``backlog.py``).

Redis down, slow, flushed or refusing: every command has a short timeout; the first failure
drops the link (the instance goes on alone at once, its probes its own again), one line is
logged per change, and the link reconnects with exponential backoff and full jitter, then
catches up from the last entry it read (the newest 2 MB of it at most). A flushed stream only
means there is nothing to catch up on. Nothing private is written: names, figures and times (``wire.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import AuthenticationError, RedisError, ResponseError

from ..config import Config, StateLink, TargetKey
from ..state import State
from ..state.breaker import CLOSED
from .backlog import LIVE_SLICE, PAGE, fold_in, tail
from .fold import Peers, fold, split, told_at
from .measures import Measures
from .names import link_name
from .probes import Probes
from .wire import MAX_EVENTS, decode, dumps, encode, fleet_ids, stream_key

__all__ = ["FleetLink"]

log = logging.getLogger("firstbyte")

TIMEOUT = 0.5  # any one command; past it Redis is slow, and slow is down for us
BLOCK_MS = 1200  # the reader's blocking read (the tick's entries, this instance's own included, end it sooner)
HEARTBEAT = 1.0  # one entry this often (wall-clock grid): the in-flight counts (this instance is live) and
#                  every sample since the last, so an instance's commands a second do not grow with its calls
URGENT = frozenset({"f", "o", "r"})  # a failure, an opening or a cool-down (and a first measure): at once
TICK_SLACK = 0.005  # a timer that fires this early is the tick
READ_GAP = 0.02  # after a read that brought entries, the next waits this long (a tick's entries in one reply)
BATCH = MAX_EVENTS  # events per stream entry at most (a reader keeps no more of one)
OUTBOX = 20_000  # events waiting at most; past it the oldest are dropped (counted)
STREAM_MAX = 20_000  # entries the stream keeps (approximately): the warm start's memory
WARM_SECS = 1.5  # a start waits at most this long for Redis before going on alone
BACKOFF_MIN, BACKOFF_MAX = 0.1, 5.0
NOT_YET = "not connected yet"


class FleetLink:
    def __init__(self, settings: StateLink, state: State, clock: Callable[[], float],
                 instance: str | None = None) -> None:
        assert settings.redis is not None
        self.settings = settings
        self.state = state
        self.clock = clock
        self.instance = instance or link_name()
        self.stream = stream_key(settings.fleet)
        self.outbox: deque[tuple[tuple[Any, ...], float]] = deque()
        self._sampled: set[tuple[TargetKey, str]] = set()  # (target, mode) this instance has told a sample of
        self.fid_of: dict[TargetKey, str] = {}
        self.keys_of: dict[str, list[TargetKey]] = {}
        self.peers = Peers()
        self.probes = Probes(self)
        self.measures = Measures(self)
        state.instance = self.instance  # who saw what last, as the access log names it
        self.connected = False
        self.since = time.time()  # in the fleet or alone since then
        self.reason = NOT_YET
        self.events_out = self.events_in = self.drops = self.reconnects = 0
        self.lag = 0.0  # seconds from a peer's entry to its fold, the last one
        self.last_id = "0-0"  # the newest entry read; a reconnect catches up from it
        self._folded = ("", 0)  # an entry begun and not finished (a drop mid-entry), and its events folded
        self._warmed = asyncio.Event()
        self._urgent = asyncio.Event()  # an event that goes before the tick
        self._task: asyncio.Task[None] | None = None
        self.redis: aioredis.Redis | None = None
        self._reader: aioredis.Redis | None = None
        self._beat_now = True  # the next send tells the loads whatever the tick (a join: live at once)
        self.read_gap = READ_GAP
        self._hurry = False  # a breaker's news went by: the next read goes at once, without the gap
        self.on_change: Callable[[], None] | None = None  # the members or the link changed: limits re-split

    def configure(self, config: Config) -> None:
        """The fleet ids of the config in force (and, for each, the local targets it names)."""
        self.fid_of = fleet_ids(config)
        keys_of: dict[str, list[TargetKey]] = {}
        for key, fid in self.fid_of.items():
            keys_of.setdefault(fid, []).append(key)
        self.keys_of = keys_of
        self.probes.configure(config)
        self.measures.configure(config)

    # -- the request path's side: one append ------------------------------------------------------

    def hear(self, event: tuple[Any, ...]) -> None:
        """State's listener: queue the change; the publisher sends it on the next tick, or at once if
        urgent. Nothing else: the request path wakes no task for a sample (docs/adr/0016)."""
        if len(self.outbox) >= OUTBOX:
            self.outbox.popleft()
            self.drops += 1
        self.outbox.append((event, time.time()))
        self.probes.heard(event)
        series = (event[1], event[2]) if event[0] == "s" else None  # a first sample: peers know it at once
        if series is not None and (series not in self._sampled or series in self.measures.unmeasured):
            self._sampled.add(series)
            self.measures.unmeasured.discard(series)  # measured now: the next samples wait for the tick
            self._urgent.set()
        elif event[0] in URGENT and (event[0] != "f" or self._counting(event[1])):
            self._urgent.set()

    def _counting(self, key: TargetKey) -> bool:
        """The target's breaker still counts failures here. Once it is open (its opening went at once), a
        failure of a call still in flight adds nothing a peer needs now: it waits for the tick."""
        ts = self.state.targets.get(key)
        return ts is None or ts.breaker.state == CLOSED

    def asked(self, route: str, mode: str) -> None:
        """A request for ``route`` in ``mode``: its measuring claims are kept (``measures.py``)."""
        self.measures.asked(route, mode)

    def to_wall(self, mono: float) -> float:
        return time.time() + (mono - self.clock())

    def fleet_in_flight(self, key: TargetKey) -> int:
        """Calls the other instances have in flight at this target, as they last said."""
        fid = self.fid_of.get(key)
        return 0 if fid is None else self.peers.in_flight(fid, self.clock())

    def share(self, limit: int) -> int:
        """This instance's part of a fleet-wide limit: ``limit`` split among the live members (the
        peers heard within PEER_LOAD_SECS and this one) in their names' order, the first ``limit % n`` one
        more; all of it while alone. Read from memory: no request awaits Redis (docs/adr/0016)."""
        if not self.connected:
            return limit
        peers = self.peers.members(self.clock())
        if not peers:
            return limit
        return split(limit, len(peers) + 1, sum(name < self.instance for name in peers))

    def members(self) -> int:
        """The live members a fleet-wide limit is split among now, this one included (1 while alone)."""
        return len(self.peers.members(self.clock())) + 1 if self.connected else 1

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def status(self) -> dict[str, Any]:
        return {"fleet": self.settings.fleet, "instance": self.instance,
                "state": "in-fleet" if self.connected else "alone",
                "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.since)),
                **({"measuring": self.measures.status()} if self.connected else {"reason": self.reason}),
                "peers": sorted(i for i, (_, until) in self.peers.loads.items() if until > self.clock())}

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self, warm_secs: float = WARM_SECS) -> None:
        """Connect and fold in the fleet's state, waiting at most ``warm_secs``: Redis unreachable
        at start is not fatal, the instance starts alone and joins when it can."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="firstbyte-fleet")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(warm_secs):
                await self._warmed.wait()

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task}, timeout=2.0)  # a client library that swallows a cancel holds no shutdown
        await self._flush()
        self._alone("closed", log_it=False)
        await self._disconnect()

    async def _flush(self) -> None:
        """A stop (a deploy) sends what waits for the tick, within TIMEOUT: the fleet, and this
        instance's next life warm-starting from the stream, keep what it learnt last."""
        if self.connected and self.outbox and self.redis is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(TIMEOUT):
                    await self._send(len(self.outbox))

    async def _run(self) -> None:
        backoff = BACKOFF_MIN
        while True:
            try:
                await self._connect()
                folded = await self._catch_up()
                await self.measures.tick()  # the fleet's measuring claims known (and one taken) before ready
                self._joined(folded)
                backoff = BACKOFF_MIN
                await self._serve()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._alone(_why(exc, self.settings))
                await self._disconnect()
            self._warmed.set()  # the start goes on, alone, after its first try
            await asyncio.sleep(random.uniform(0, backoff))  # full jitter: a fleet does not reconnect in step
            backoff = min(BACKOFF_MAX, backoff * 2)
            self.reconnects += 1

    async def _connect(self) -> None:
        url, password = self.settings.redis, self.settings.password
        assert url is not None
        common: dict[str, Any] = {"password": password, "decode_responses": True, "socket_connect_timeout": TIMEOUT,
                                  "retry_on_timeout": False, "health_check_interval": 0}
        self.redis = aioredis.Redis.from_url(url, socket_timeout=TIMEOUT, **common)
        self._reader = aioredis.Redis.from_url(url, socket_timeout=TIMEOUT + BLOCK_MS / 1000, **common)
        await self.redis.ping()
        await self._reader.ping()

    async def _disconnect(self) -> None:
        for client in (self.redis, self._reader):
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.aclose()
        self.redis = self._reader = None

    async def _catch_up(self) -> int:
        """The first time, the stream's tail (warm start); after a drop, what came since the last
        entry read: both bounded, folded oldest first, the loop served between slices
        (``backlog.py``; an XREAD from the last entry once folded ~260,000 events in one pass).
        Returns the events folded now."""
        assert self.redis is not None
        entries = await tail(self.redis, self.stream, self.last_id)
        return await fold_in(reversed(entries), lambda entry_id, fields: self._take(entry_id, fields, warm=True))

    def _joined(self, folded: int) -> None:
        self.connected = True
        self.since = time.time()
        self.state.set_gated(True)
        self.state.listener = self.hear
        self._beat_now = True  # tell the others at once that this instance is live
        self._urgent.set()
        self._warmed.set()
        self._changed()
        log.info("fleet %s: joined as %s via %s (%d events folded in)", self.settings.fleet, self.instance,
                 self.settings.redis, folded)

    def _alone(self, reason: str, log_it: bool = True) -> None:
        """Off the link: go on from local state at once; one line when this changes something."""
        was_connected, old_reason = self.connected, self.reason
        self.connected = False
        self.state.listener = None
        self.state.set_gated(False)
        self.probes.dropped()
        self.measures.dropped()
        self.outbox.clear()
        self._changed()  # alone: every limit is this instance's whole again
        self.reason = reason
        first = old_reason == NOT_YET
        if was_connected or first:  # one line per change: joined, left (a retry that fails says nothing)
            self.since = time.time()
            if log_it:
                log.warning("fleet %s: %s; %s alone, reconnecting", self.settings.fleet, reason,
                            "carrying on" if was_connected else "starting")
        elif reason != old_reason:
            log.debug("fleet %s: still alone: %s", self.settings.fleet, reason)

    async def _serve(self) -> None:
        tasks = [asyncio.create_task(coro) for coro in (self._publish(), self._read(), self.probes.run(),
                                                              self.measures.run())]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()  # raises what ended it
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- out and in ---------------------------------------------------------------------------------

    async def _publish(self) -> None:
        tick = _next_tick(time.time())
        while True:
            # One entry a tick (the heartbeat: the counts and every event since the last), on the wall
            # clock's grid so the fleet's entries of one tick reach each reader in one reply; an urgent
            # event (a breaker's, a first measure) goes at once with what is queued. At concurrency 1 a
            # call costs no Redis round trip of its own (docs/adr/0016, "one entry a tick").
            if tick - time.time() > HEARTBEAT:  # the wall clock was set back: the grid from now
                tick = _next_tick(time.time())
            with contextlib.suppress(TimeoutError):  # asyncio.timeout: 3.11's wait_for can lose a cancel
                async with asyncio.timeout(max(0.0, tick - time.time())):
                    await self._urgent.wait()
                    self._hurry = True  # peers' failures come together: read theirs without the gap
            self._urgent.clear()
            now = time.time()
            if (after := served(now, tick)) is not None:
                self._tell_loads()
                tick = after
            elif self._beat_now:  # a join: live at once, the grid kept
                self._tell_loads()
            await self._send(len(self.outbox))  # what comes while sending waits for its turn

    async def _send(self, pending: int) -> None:
        while pending > 0:
            n = min(pending, BATCH)
            pending -= n
            batch = [self.outbox.popleft() for _ in range(n)]
            wires = encode(batch, self.fid_of, self.to_wall)
            if wires:
                assert self.redis is not None
                try:
                    await self.redis.xadd(self.stream, {"i": self.instance, "e": dumps(wires)},
                                          maxlen=STREAM_MAX, approximate=True)
                except BaseException:
                    self.drops += n
                    raise
            self.events_out += n

    def _tell_loads(self) -> None:
        """This instance's calls in flight per fleet id, every HEARTBEAT (an empty count says this
        instance is live). Not on each change: a member's share needs only who is live, and a
        count at each change cost an entry every few calls."""
        loads: dict[str, int] = {}
        for key, ts in self.state.targets.items():
            fid = self.fid_of.get(key)
            if fid is not None and ts.in_flight:
                loads[fid] = loads.get(fid, 0) + ts.in_flight
        self._beat_now = False
        self.outbox.append((("n", loads), time.time()))

    async def _read(self) -> None:
        reader = self._reader
        assert reader is not None
        while True:
            reply: Any = await reader.xread({self.stream: self.last_id}, block=BLOCK_MS, count=PAGE)
            for _stream, entries in reply or ():
                await fold_in(entries, self._take, every=LIVE_SLICE)
            self._changed()  # at least every BLOCK_MS: a member heard, or one gone quiet
            if reply and not self._hurry:  # a tick's entries come together: the gap reads them in one reply
                await asyncio.sleep(self.read_gap)
            self._hurry = False  # a failure, an opening or a cool-down: the next peer's may be on its way

    def _take(self, entry_id: str, fields: dict[str, str], warm: bool = False) -> Iterator[tuple[int, int]]:
        """Fold one entry a slice at a time; it is read once whole. A drop mid-entry leaves ``_folded`` saying
        how far it got, so the catch-up reads it again and folds the rest: not nothing, nor all of it twice."""
        done = self._folded[1] if self._folded[0] == entry_id else 0
        for read, applied in self._fold(entry_id, fields, warm, done):
            self._folded = (entry_id, done := done + read)
            yield read, applied
        self.last_id, self._folded = entry_id, ("", 0)

    def _fold(self, entry_id: str, fields: dict[str, str], warm: bool, skip: int) -> Iterator[tuple[int, int]]:
        """A peer's entry past its first ``skip`` events, LIVE_SLICE a step (each: the events read, those applied
        here), so the caller can serve the loop between them: an entry holds up to a second of a peer's samples."""
        instance = fields.get("i", "")
        if instance == self.instance:
            return  # our own: applied when it happened
        wires = decode(fields.get("e", "[]"))
        offset = self.clock() - time.time()  # wall clock to ours, read once per entry, not per event
        for start in range(skip, len(wires), LIVE_SLICE):
            part, now = wires[start:start + LIVE_SLICE], self.clock()
            applied = fold(self.state, instance, part, self.keys_of, now, lambda wall: wall + offset, self.peers,
                           told_at(entry_id, offset, now))
            kinds = {wire[0] for wire in part}
            if kinds & {"f", "o"}:
                self.probes.wake()  # a breaker may have opened: its probe claim is looked after from now
            self._hurry = self._hurry or bool(kinds & URGENT)
            self.events_in += len(part)
            yield len(part), applied
        if not warm:
            with contextlib.suppress(ValueError):
                self.lag = max(0.0, time.time() - int(entry_id.split("-")[0]) / 1000)


def _next_tick(now: float) -> float:
    """The heartbeat's next tick after ``now``: on the wall clock's grid, the same for every instance."""
    return (now // HEARTBEAT + 1) * HEARTBEAT


def served(now: float, tick: float) -> float | None:
    """The tick after ``tick`` when ``now`` serves it (a timer may fire up to TICK_SLACK early: that
    beat is this tick's, and the next is a whole tick away), else None (an urgent send before it)."""
    return None if now < tick - TICK_SLACK else _next_tick(max(now, tick))


def _why(exc: BaseException, settings: StateLink) -> str:
    """One line a person can act on, never the password."""
    if isinstance(exc, AuthenticationError) or (isinstance(exc, ResponseError) and "NOAUTH" in str(exc)):
        where = f"${settings.password_env}" if settings.password_env else "no password (state.password_env unset)"
        return f"Redis refused the password ({where}): {str(exc).rstrip('.')}"
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return f"Redis at {settings.redis} did not answer within {TIMEOUT}s"
    if isinstance(exc, RedisError | OSError):
        return f"Redis at {settings.redis} unreachable: {str(exc).rstrip('.')}"  # the log line goes on after it
    return f"fleet link failed: {type(exc).__name__}: {exc}"
