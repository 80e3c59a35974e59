"""OpenTelemetry traces from finished exchanges: one span per request, a child per attempt.

A sampled exchange's record is queued as it is (the ``Finished`` the server built anyway, with the
ids the request path chose in ``proxy/traceparent.py``); nothing is built or encoded for it then.
A task the observer owns wakes every ``tracing.export_every`` (half a second), or as soon as a
batch is full, encodes what is queued into OTLP spans (``spans.py``, a slice at a time so the
loop keeps serving) and posts them in batches over OTLP/HTTP: at any busy rate a post carries
a full batch, so its cost is shared by some 250 requests. A slow or dead collector fills the
bounded queue and records are dropped, before any encoding was spent on them, while no request
waits for anything (docs/adr/0012).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from importlib.metadata import PackageNotFoundError, version

import aiohttp

from ..config import Config, Tracing
from . import Finished
from .otlp import attr, export_request, scope
from .spans import SpanWriter

__all__ = ["Traces"]

log = logging.getLogger("firstbyte")

EXPORT_TIMEOUT = 5.0  # seconds one export may take
CLOSE_WAIT = 2.0  # seconds a stop waits for the last spans to go out
BATCH = 512  # spans per export, about (a record's spans are never split); a full one wakes the exporter
SLICE = 64  # records encoded in one turn of the loop
WARN_EVERY = 60.0  # seconds between two warnings about a collector that fails


def _version() -> str:
    try:
        return version("firstbyte")
    except PackageNotFoundError:  # pragma: no cover - run from a tree that was not installed
        return "0"


class Traces:
    """Observer: finished exchanges with a sampled trace are queued; its own task makes them OTLP
    spans and posts them."""

    def __init__(self, tracing: Tracing, config: Config | None = None) -> None:
        self.tracing = tracing
        self.url = tracing.otlp or ""
        self.queue: deque[Finished] = deque()
        self.queued = 0  # spans the queued records make (``tracing.queue`` bounds it)
        self.dropped = 0  # spans the full queue turned away
        self.failed = 0  # spans whose export failed
        self.writer = SpanWriter(config)
        self._resource = attr("service.name", tracing.service_name, 1)
        self._scope = scope("firstbyte", _version())
        self._task: asyncio.Task[None] | None = None  # kept: a bare task may be collected
        self._full = asyncio.Event()  # a batch is waiting: post it now, not at the next tick
        self._warned = 0.0

    def reconfigure(self, config: Config) -> None:
        """The targets' upstream models and fixed attributes, for the attempt spans."""
        self.writer.reconfigure(config)

    def on_finished(self, finished: Finished) -> None:
        ctx = finished.trace
        if ctx is None or not ctx.sampled:
            return
        d = finished.decision
        count = 1 if d is None else 1 + len(d.attempts)
        if self.queued + count > self.tracing.queue:
            self.dropped += count
            return
        self.queue.append(finished)
        self.queued += count
        if self.queued >= BATCH:
            self._full.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="firstbyte-traces")

    async def _batch(self) -> tuple[list[bytes], int]:
        """Up to about BATCH spans from the queue, encoded SLICE records per turn of the loop, and
        how many records they came from."""
        spans: list[bytes] = []
        taken = 0
        while self.queue and len(spans) < BATCH:
            for _ in range(min(SLICE, len(self.queue))):
                taken += 1
                f = self.queue.popleft()
                self.queued -= 1 if f.decision is None else 1 + len(f.decision.attempts)
                try:
                    spans += self.writer.spans(f)
                except Exception:  # a bug in one record's spans loses that record, not the exporter
                    log.exception("tracing: a span could not be encoded")
            if self.queue and len(spans) < BATCH:
                await asyncio.sleep(0)
        return spans, taken

    async def _run(self) -> None:
        """Post at each tick what was queued by then, and a full batch as soon as there is one.
        What arrives while a post is out waits for the next of those: under a steady stream of
        requests the posts carry full batches, not the few requests that came during the last."""
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
            while True:
                ticked = False
                try:
                    async with asyncio.timeout(self.tracing.export_every):
                        await self._full.wait()
                except TimeoutError:
                    ticked = True
                self._full.clear()
                due = len(self.queue) if ticked else 0  # the records the tick sends, however few
                while self.queue and (due > 0 or self.queued >= BATCH):
                    due -= await self._send(session)

    async def _send(self, session: aiohttp.ClientSession) -> int:
        """One batch to the collector; a failure drops it (with a warning at most once a minute).
        Returns how many records it took from the queue."""
        batch, taken = await self._batch()
        if not batch:
            return taken
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
        return taken

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

