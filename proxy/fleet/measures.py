"""A cold fleet measures each target once per mode: measuring claims, shared out ahead of traffic.

Alone, an instance ranks unmeasured targets first in written order, and a second request while
the first is measuring goes elsewhere (``routing/ordering.py``). Three instances hit at the same
instant each measured the same first target: no sample can travel before each has led with it.
So the instances share out the measuring through Redis before the requests come, and no request
ever awaits Redis (docs/adr/0016, "One measure per target and mode"):

- Every ``TICK`` while a target of a ``fastest`` route is unmeasured in a mode (and usable), this
  task reads who holds each such claim (one ``MGET`` of ``firstbyte:FLEET:measure:MODE:FID``) and
  swaps the peers' claims into ``State.measuring``; every ``QUIET_TICK`` once nothing changed for
  ``QUIET_SECS`` (an idle fleet: the claims stand as they are), or while no mode with claims to read
  was asked for here (a cold start's other mode; its first request wakes the task at once). The
  planner counts a peer's claim as a call measuring the target, as it counts its own: the target
  goes behind the measured ones and behind unmeasured ones nobody measures. It reads a set; it
  never waits.
- Each instance keeps one unused claim per mode ahead of its traffic: when every claim it holds in
  a mode is in use (its own call is measuring it) or it holds none, it takes the next unclaimed
  target in written order (``SET NX PX``). A fleet of N instances so holds N different targets'
  claims before the first request, and each instance's first request goes to its own.
- A claim is no longer renewed once the target is measured in that mode (by anyone) or stops
  needing it (its breaker opened, a reload dropped it): it expires within ``TTL``, so a peer that
  has not folded the sample in yet still reads the target as being measured. One that went unused
  for ``UNUSED_SECS`` while the fleet answered in that mode is given back (deleted only if still
  ours): its holder gets no traffic, so another instance measures it; the holder does not take it
  again until a route of it is asked for here. A holder that died blocks nobody longer than ``TTL``.
- Claims only where there is traffic: until ``LIVE_GRACE`` after this instance's first request
  (the cold start) every route and mode claims ahead; after, only the (route, mode) pairs this
  instance was asked for. A claim given back unused is not taken again until one of its routes is
  asked for in its mode. With nothing to claim or read the task sleeps (a route asked for anew, or
  a reload, wakes it): an instance whose routes are measured, or get no traffic, sends Redis nothing
  for them (docs/adr/0016, amendment "what is per call and what is per second").
- Redis down: the link drops, the set is emptied (``dropped``), and each instance measures for
  itself as it does alone.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from ..config import Config, Route, TargetKey
from ..state.tracker import BUFFERED, MODES
from .probes import _GIVE_BACK
from .wire import measure_key

if TYPE_CHECKING:
    from .link import FleetLink

__all__ = ["Measures"]

TICK = 0.05  # how often unmeasured targets' claims are read (only while some target is unmeasured)
QUIET_TICK = 0.5  # ... once the claims and what is unmeasured stayed the same for QUIET_SECS
QUIET_SECS = 1.0
TTL = 3.0  # a claim lives this long unless renewed: a dead holder blocks nobody longer
RENEW_SECS = 1.0
UNUSED_SECS = 1.0  # a claim unused this long while the fleet answered in its mode goes back
LIVE_GRACE = 5.0  # after this instance's first request, every route and mode still claims ahead this long
IDLE_TICK = 2.0  # nothing to claim or read: look again this often (a route asked for anew wakes the task)

Claim = tuple[str, str]  # (fleet id, mode)

# Renew the claim only if it is still ours.
_RENEW = ("if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) "
          "else return 0 end")


class Measures:
    def __init__(self, link: FleetLink) -> None:
        self.link = link
        self.held: dict[Claim, float] = {}  # claim -> when last used (or taken), this process's clock
        self.renewed: dict[Claim, float] = {}
        self.idle: set[Claim] = set()  # given back unused: not taken again until a route of it is asked for
        self.routes: list[Route] = []
        self.names: frozenset[str] = frozenset()
        self.fresh: set[tuple[str, str]] = set()  # (route, mode) asked for since the last tick
        self.live: set[tuple[str, str]] = set()  # ... since start
        self.first_asked: float | None = None  # the tick that saw this instance's first request
        self.routes_of: dict[Claim, set[str]] = {}  # the routes whose unmeasured targets a claim names
        self.pending = True  # the last tick wanted some claim read or taken
        self.busy = False  # ... of a mode this instance was asked for (the others' claims stand, read slowly)
        self._wake = asyncio.Event()
        self.claims = 0  # won, since start
        self._seen: object = None  # what the last tick read: unmeasured, holders, in use
        # (target, mode) pairs without a figure, as the last tick saw: a sample of one (a first measure)
        # goes to the peers at once, and the link takes the pair out (the tick may be 0.5 s away: every
        # sample until then went at once). Local targets, not fleet ids: one upstream named twice, one
        # of the names measured, would make every sample of the measured one urgent.
        self.unmeasured: set[tuple[TargetKey, str]] = set()
        self._changed_at = 0.0

    def configure(self, config: Config) -> None:
        self.routes = [r for r in config.routes.values() if r.strategy == "fastest"]
        self.names = frozenset(r.name for r in self.routes)
        self._wake.set()

    def asked(self, route: str, mode: str) -> None:
        """A request for ``route`` in ``mode`` (the request path: a set lookup, nothing awaited)."""
        pair = (route, mode)
        if pair not in self.fresh and route in self.names:
            self.fresh.add(pair)
            if pair not in self.live:
                self._wake.set()

    def dropped(self) -> None:
        """The link is down: our claims expire on their own; nobody else's binds us."""
        self.held.clear()
        self.renewed.clear()
        self.unmeasured = set()
        self.link.state.set_measuring(frozenset())

    def status(self) -> list[str]:
        """The claims this instance holds, ``MODE FID`` each (for ``/v1/health``)."""
        return sorted(f"{mode} {fid}" for fid, mode in self.held)

    async def run(self) -> None:
        while True:
            if not self.pending:  # nothing unmeasured where there is traffic: sleep until asked
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(IDLE_TICK):
                        await self._wake.wait()
            else:  # often only while a mode asked for here has claims to read (a request of another wakes it)
                quiet = not self.busy or self.link.clock() - self._changed_at > QUIET_SECS
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(QUIET_TICK if quiet else TICK):
                        await self._wake.wait()
            self._wake.clear()
            await self.tick()

    async def tick(self) -> None:
        """Read the claims of what is unmeasured, tend ours, take one ahead per mode."""
        link, now = self.link, self.link.clock()
        unmeasured = self._unmeasured(now)
        self.unmeasured = {(key, claim[1]) for claim, keys in unmeasured.items() for key in keys}
        wanted = self._wanted(unmeasured, now)
        self.pending = bool(wanted)
        self.busy = bool({m for _, m in wanted} & {m for _, m in self.live})
        for claim in [c for c in self.held if c not in wanted]:
            # Measured (or no longer measurable, or no traffic here): left to expire, not deleted, so a
            # peer whose view lacks the sample yet still reads it as being measured, not free to measure.
            self.held.pop(claim, None)
            self.renewed.pop(claim, None)
        if not wanted:
            if link.state.measuring:
                link.state.set_measuring(frozenset())
            return
        assert link.redis is not None
        holders: list[Any] = await link.redis.mget([self._key(c) for c in wanted])
        free: list[Claim] = []
        peers: set[tuple[TargetKey, str]] = set()
        for (claim, keys), holder in zip(wanted.items(), holders, strict=True):
            if holder is None or holder != link.instance:
                self.held.pop(claim, None)  # expired (a flush) or someone else's: not ours
            if holder is None:
                free.append(claim)
            elif holder != link.instance:
                peers.update((key, claim[1]) for key in keys)
        link.state.set_measuring(frozenset(peers))
        seen = (holders, {c: self._in_use(keys, c[1]) for c, keys in wanted.items()})
        if seen != self._seen:  # traffic or a peer moved something: look often again
            self._seen, self._changed_at = seen, now
        await self._tend(wanted, now)
        await self._claim_ahead(wanted, free, now)

    def _unmeasured(self, now: float) -> dict[Claim, list[TargetKey]]:
        """Every (fleet id, mode) a usable target of a ``fastest`` route has no figure in, in written
        order, with the local targets it names."""
        link, state = self.link, self.link.state
        out: dict[Claim, list[TargetKey]] = {}
        routes_of: dict[Claim, set[str]] = {}
        for route in self.routes:
            for target in route.targets:
                fid = link.fid_of.get(target.key)
                if fid is None or not state.health(target.key, now).usable:
                    continue
                for mode in MODES:
                    if state.figure(target.key, route.fastest, now, mode) is None:
                        keys = out.setdefault((fid, mode), [])
                        if target.key not in keys:
                            keys.append(target.key)
                        routes_of.setdefault((fid, mode), set()).add(route.name)
        self.routes_of.update(routes_of)  # kept for claims given back, until their route is asked for
        return out

    def _wanted(self, unmeasured: dict[Claim, list[TargetKey]], now: float) -> dict[Claim, list[TargetKey]]:
        """The claims worth reading and holding: those of routes with traffic here (every route's
        during the cold start), less those given back unused until their route is asked for again."""
        fresh, self.fresh = self.fresh, set()
        self.live |= fresh
        if fresh and self.first_asked is None:
            self.first_asked = now
        for route, mode in fresh:
            self.idle -= {c for c in self.idle if c[1] == mode and route in self.routes_of.get(c, ())}
        cold = self.first_asked is None or now - self.first_asked < LIVE_GRACE
        return {claim: keys for claim, keys in unmeasured.items() if claim not in self.idle and (
            cold or any((route, claim[1]) in self.live for route in self.routes_of[claim]))}

    def _in_use(self, keys: list[TargetKey], mode: str) -> bool:
        """A call of this instance is measuring the target in the mode now."""
        targets = self.link.state.targets
        for key in keys:
            ts = targets.get(key)
            if ts is not None and (ts.buffering if mode == BUFFERED else ts.in_flight - ts.buffering) > 0:
                return True
        return False

    async def _tend(self, wanted: dict[Claim, list[TargetKey]], now: float) -> None:
        """Mark what is in use, give back what went unused while the fleet was busy, renew the rest."""
        link = self.link
        for claim, used in list(self.held.items()):
            if self._in_use(wanted[claim], claim[1]):
                self.held[claim] = now
            elif now - used > UNUSED_SECS and self._answered_since(claim[1], used, now):
                self.idle.add(claim)
                await self._give_back(claim)
                continue
            if now - self.renewed.get(claim, 0.0) > RENEW_SECS:
                assert link.redis is not None
                if await link.redis.eval(_RENEW, 1, self._key(claim), link.instance, int(TTL * 1000)):
                    self.renewed[claim] = now
                else:
                    self.held.pop(claim, None)

    def _answered_since(self, mode: str, since: float, now: float) -> bool:
        """Some target got a sample in ``mode`` (here or from a peer) after ``since``: the fleet has traffic."""
        state = self.link.state
        for route in self.routes:
            for target in route.targets:
                age = state.age(target.key, now, mode)
                if age is not None and now - age > since:
                    return True
        return False

    async def _claim_ahead(self, wanted: dict[Claim, list[TargetKey]], free: list[Claim], now: float) -> None:
        """Per mode, one unused claim ahead of the traffic: take the first free one we may."""
        link = self.link
        for mode in MODES:
            if any(m == mode and not self._in_use(wanted[(f, m)], m) for f, m in self.held):
                continue
            for claim in free:
                if claim[1] != mode:
                    continue
                assert link.redis is not None
                if await link.redis.set(self._key(claim), link.instance, nx=True, px=int(TTL * 1000)):
                    self.held[claim] = self.renewed[claim] = now
                    self.claims += 1
                    break

    async def _give_back(self, claim: Claim) -> None:
        self.held.pop(claim, None)
        self.renewed.pop(claim, None)
        link = self.link
        assert link.redis is not None
        await link.redis.eval(_GIVE_BACK, 1, self._key(claim), link.instance)

    def _key(self, claim: Claim) -> str:
        return measure_key(self.link.settings.fleet, claim[0], claim[1])
