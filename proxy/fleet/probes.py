"""One half-open probe per cooldown for the whole fleet, claimed in Redis off the request path.

While the link is up every breaker is gated (``state/breaker.py``): when one's cooldown is over,
this task tries ``SET firstbyte:FLEET:probe:FID INSTANCE NX PX ttl``. The instance that wins may
let one probe through; everyone else reads the target as probing until the verdict arrives
(a sample closes it, a reopening sets a new cooldown). The claim is given back (deleted only if
still ours) at the verdict, when the probe ends without one, or when this instance had no call
for the target within ``UNUSED_SECS``; otherwise it expires after the probe's longest possible
run (its provider's connect plus first-chunk timeouts), so a claimer that died blocks nobody long.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from ..config import Config, TargetKey
from ..state.breaker import OPEN
from .wire import claim_key

if TYPE_CHECKING:
    from .link import FleetLink

__all__ = ["Probes"]

TICK = 0.02  # how often half-open breakers are looked at while some breaker is open or a claim held
IDLE_TICK = 5.0  # ... while none is: an opening, ours or a peer's, wakes the task at once (a safety net)
UNUSED_SECS = 1.0  # a claim no call used by then goes back to the fleet
RETRY_SECS = 0.25  # after losing a claim (or giving back an unused one), wait this long to try again
MAX_TTL = 120.0

# Delete the claim only if it is still ours: one that expired may be someone else's now.
_GIVE_BACK = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"


class Probes:
    def __init__(self, link: FleetLink) -> None:
        self.link = link
        self.held: dict[str, float] = {}  # fid -> when claimed (this process's clock)
        self.back: set[str] = set()  # claims to give back on the next tick
        self.retry_at: dict[str, float] = {}
        self.ttl_of: dict[str, float] = {}
        self.claims = 0  # won, since start
        self._wake = asyncio.Event()

    def configure(self, config: Config) -> None:
        ttl: dict[str, float] = {}
        for key, fid in self.link.fid_of.items():
            t = config.providers[key[0]].timeouts
            ttl[fid] = min(MAX_TTL, max(ttl.get(fid, 0.0), t.connect + t.first_chunk))
        self.ttl_of = ttl

    def heard(self, event: tuple[Any, ...]) -> None:
        """A local change: a verdict (a sample, a reopening) or a probe given back ends our claim;
        an opening wakes the task from its idle tick."""
        if event[0] == "o":
            self.wake()
        if event[0] in ("s", "o", "p"):
            fid = self.link.fid_of.get(event[1])
            if fid is not None and fid in self.held:
                self.back.add(fid)

    def dropped(self) -> None:
        """The link is down: our claims expire on their own."""
        self.held.clear()
        self.back.clear()

    def wake(self) -> None:
        """A breaker opened (here or heard from a peer): look every TICK until it is settled."""
        if not self._wake.is_set():
            self._wake.set()

    async def run(self) -> None:
        while True:
            if self._busy():
                await asyncio.sleep(TICK)
            else:  # nothing open, nothing held: one wakeup in 5 s, not 50 a second (docs/adr/0016)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(IDLE_TICK):
                        await self._wake.wait()
            self._wake.clear()
            await self._give_back()
            await self._claim()

    def _busy(self) -> bool:
        return bool(self.held or self.back or self._wake.is_set()) or any(
            ts.breaker.state == OPEN for ts in self.link.state.targets.values())

    async def _give_back(self) -> None:
        link, now = self.link, self.link.clock()
        for fid, since in list(self.held.items()):
            if fid not in self.back and now - since > UNUSED_SECS and self._unspent(fid):
                self._grant(fid, False)  # nobody here used it: let another instance probe
                self.retry_at[fid] = now + RETRY_SECS
                self.back.add(fid)
        for fid in list(self.back):
            self.back.discard(fid)
            self.held.pop(fid, None)
            assert link.redis is not None
            await link.redis.eval(_GIVE_BACK, 1, claim_key(link.settings.fleet, fid), link.instance)

    async def _claim(self) -> None:
        link, now = self.link, self.link.clock()
        state = link.state
        wanted: set[str] = set()
        for key, ts in state.targets.items():
            breaker = ts.breaker
            if breaker.half_open(now) and not breaker.claimed:
                fid = link.fid_of.get(key)
                if fid is not None and fid not in self.held and self.retry_at.get(fid, 0.0) <= now:
                    wanted.add(fid)
        for fid in wanted:
            assert link.redis is not None
            ttl_ms = int(self.ttl_of.get(fid, 35.0) * 1000)
            won = await link.redis.set(claim_key(link.settings.fleet, fid), link.instance, nx=True, px=ttl_ms)
            if won:
                self.held[fid] = link.clock()
                self.claims += 1
                self._grant(fid, True)
            else:
                self.retry_at[fid] = now + RETRY_SECS

    def _grant(self, fid: str, granted: bool) -> None:
        state = self.link.state
        for key in self.link.keys_of.get(fid, ()):
            state.probe_granted(state.target(key), granted)

    def _unspent(self, fid: str) -> bool:
        keys: list[TargetKey] = self.link.keys_of.get(fid, [])
        return any((ts := self.link.state.targets.get(k)) is not None and ts.breaker.claimed for k in keys)
