"""This worker's place in a box of workers (``serve`` under :mod:`proxy.supervisor`).

A worker listens on a private Unix socket in the supervisor's run directory beside its share
of the public address; through it the worker a scrape reaches asks every other worker for its
own ``/metrics`` and answers for the whole box (:mod:`proxy.observe.box`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from .observe.box import merge
from .supervisor import RUN_DIR_ENV, WORKERS_ENV

__all__ = ["LOCAL_METRICS", "Box"]

log = logging.getLogger(__name__)

LOCAL_METRICS = "/box/metrics"  # served on the private socket only: this worker's own text
ASK_TIMEOUT = 2.0


@dataclass(frozen=True, slots=True)
class Box:
    index: int
    count: int
    run_dir: Path

    @classmethod
    def from_env(cls, index: int, env: Mapping[str, str] | None = None) -> Box:
        env = os.environ if env is None else env
        return cls(index=index, count=int(env.get(WORKERS_ENV, "1")), run_dir=Path(env[RUN_DIR_ENV]))

    def socket(self, index: int) -> str:
        return str(self.run_dir / f"worker-{index}.sock")

    async def _ask(self, index: int) -> str | None:
        """Another worker's own metrics text; None when it does not answer (dead, restarting)."""
        try:
            connector = aiohttp.UnixConnector(path=self.socket(index))
            timeout = aiohttp.ClientTimeout(total=ASK_TIMEOUT)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session, \
                    session.get(f"http://worker{index}{LOCAL_METRICS}") as resp:
                if resp.status == 200:
                    return await resp.text()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            log.warning("/metrics: worker %d did not answer (%s); its series are left out", index, exc)
        return None

    async def metrics(self, own: str) -> str:
        """The whole box's metrics, given this worker's own text."""
        others = [i for i in range(self.count) if i != self.index]
        texts = await asyncio.gather(*(self._ask(i) for i in others))
        return merge([own, *(t for t in texts if t is not None)])
