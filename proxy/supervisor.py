"""``serve`` with ``workers`` > 1: a small parent that starts, watches and signals the workers.

Each worker is the same server as a single process (``firstbyte serve --worker I``) with its own
``SO_REUSEPORT`` socket on the listen address, so the kernel spreads new connections among them.
Workers tell the supervisor how they are through the systemd notify protocol they already speak:
each gets a private ``NOTIFY_SOCKET`` of its own in the supervisor's run directory. The
supervisor is the one systemd talks to: ``READY=1`` once every worker listens, ``WATCHDOG=1``
only while every worker is alive, ``STATUS=`` with their count, ``RELOADING=1`` around a reload.

A worker that dies is started again (at once the first time, then with a doubling backoff while
it keeps dying young), with a log line naming its exit code or signal. SIGHUP validates the file
once here: a bad file is logged once and no worker is disturbed; a good one is re-read by every
worker. SIGTERM passes to every worker, which drains within ``shutdown_grace``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import tempfile
import time
from pathlib import Path

from .config import Config, load_config
from .config.advice import limit_advice
from .errors import ConfigError
from .forked import Forked, fork
from .sdnotify import Notifier

__all__ = ["PARENT_ENV", "RUN_DIR_ENV", "WORKERS_ENV", "Supervisor", "follow_parent"]

log = logging.getLogger("firstbyte.supervisor")

RUN_DIR_ENV = "FIRSTBYTE_RUN_DIR"  # where the workers' private sockets are
WORKERS_ENV = "FIRSTBYTE_WORKERS"  # how many workers the box has
PARENT_ENV = "FIRSTBYTE_SUPERVISOR"  # the supervisor's pid
YOUNG = 5.0  # a worker that dies sooner than this after its start backs the next start off
BACKOFF_MAX = 5.0
START_TIMEOUT = 60.0


def why(code: int) -> str:
    """A worker's end in words: its exit code, or the signal that killed it."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def follow_parent(parent: int) -> None:
    """In a worker: SIGTERM (a drain) when the supervisor dies, so no worker outlives its box."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return
    if os.getppid() != parent:  # the supervisor died before the line above
        os.kill(os.getpid(), signal.SIGTERM)


async def _preload() -> None:
    """Done once here, not at every worker's start: the workers are forked after it and inherit
    the aiohttp internals' check (a probe server and client) and the TLS context (the CA store)."""
    from .internals import checked
    from .upstream.http1 import default_tls

    await checked()
    default_tls()


class Worker:
    """One worker slot: its process now, its notify socket and what it last said."""

    def __init__(self, index: int, run_dir: Path) -> None:
        self.index = index
        self.notify_path = run_dir / f"notify-{index}.sock"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.notify_path))
        self.sock.setblocking(False)
        self.proc: Forked | None = None
        self.started = 0.0
        self.ready = asyncio.Event()
        self.backoff = 0.0

    def read_notes(self) -> None:
        """Take every datagram waiting: ``READY=1`` marks the worker ready (at start, after a reload)."""
        while True:
            try:
                data = self.sock.recv(4096)
            except (BlockingIOError, InterruptedError):
                return
            if b"READY=1" in data.split(b"\n"):
                self.ready.set()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None


class Supervisor:
    def __init__(self, config_path: str, config: Config, listen: str | None, workers: int,
                 log_level: str = "info") -> None:
        self.config_path = config_path
        self.config = config
        self.listen = listen or config.listen
        self.count = workers
        self.log_level = log_level
        self.notifier = Notifier()
        self.run_dir = Path(tempfile.mkdtemp(prefix="firstbyte-"))
        self.workers = [Worker(i, self.run_dir) for i in range(workers)]
        self.stopping = asyncio.Event()
        self.failed: str | None = None
        self.restarts = 0
        self._all_ready_once = False  # a worker that dies before the box first listened ends the box

    async def _spawn(self, worker: Worker) -> None:
        """Fork a worker from this process, which has imported the server already (a replaced
        worker starts in well under a second: docs/workers.md has the measurements)."""
        from .cli import main

        argv = ["--log-level", self.log_level, "serve", "--config", self.config_path, "--listen", self.listen,
                "--worker", str(worker.index)]
        env = {"NOTIFY_SOCKET": str(worker.notify_path), RUN_DIR_ENV: str(self.run_dir),
               WORKERS_ENV: str(self.count), PARENT_ENV: str(os.getpid())}
        worker.ready.clear()
        worker.started = time.monotonic()
        worker.proc = fork(lambda: main(argv), env, ("WATCHDOG_USEC", "WATCHDOG_PID"),
                           [w.sock for w in self.workers])
        log.info("worker %d started (pid %d)", worker.index, worker.proc.pid)

    async def _watch(self, worker: Worker) -> None:
        """Keep one slot filled until the box stops: a dead worker is said and replaced."""
        while True:
            assert worker.proc is not None
            code = await worker.proc.wait()
            if self.stopping.is_set():
                return
            if not worker.ready.is_set() and self.restarts == 0 and not self._all_ready_once:
                self.failed = f"worker {worker.index} {why(code)} before it listened (its log says why)"
                self.stopping.set()
                return
            lived = time.monotonic() - worker.started
            worker.backoff = 0.0 if lived >= YOUNG else min(BACKOFF_MAX, max(0.1, worker.backoff * 2))
            log.error("worker %d (pid %d) %s after %.1fs; starting another in %.1fs",
                      worker.index, worker.proc.pid, why(code), lived, worker.backoff)
            self._status()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), worker.backoff)
            if self.stopping.is_set():
                return
            self.restarts += 1
            await self._spawn(worker)
            self._status()

    def _status(self) -> None:
        alive = sum(w.alive for w in self.workers)
        self.notifier.status(f"{alive} of {self.count} workers alive on {self.listen}; "
                             f"{self.restarts} restarted")

    async def _watchdog(self) -> None:
        """WATCHDOG=1 only while every worker is alive: a box short of a worker for a whole
        interval is what systemd's watchdog should hear about."""
        interval = self.notifier.watchdog_interval()
        if interval is None:
            return
        while True:
            if all(w.alive for w in self.workers):
                self.notifier.watchdog()
            await asyncio.sleep(interval)

    async def reload(self) -> bool:
        """Validate the file once; only a good one reaches the workers (each re-reads it)."""
        self.notifier.reloading()
        try:
            try:
                config = load_config(self.config_path)  # here, not in a thread: workers are forked
            except ConfigError as exc:
                log.error("reload refused, every worker keeps the running config: %s", exc)
                return False
            if config.workers != self.count:
                log.warning("workers changed: takes effect on restart")
            self._advise(config)
            for w in self.workers:
                w.ready.clear()
                if w.alive and w.proc is not None:
                    w.proc.send_signal(signal.SIGHUP)
            waits = [w.ready.wait() for w in self.workers if w.alive]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*waits), 30)
            log.info("reload passed to %d workers", len(waits))
            return True
        finally:
            self.notifier.ready()

    def _advise(self, config: Config) -> None:
        """Once for the box, not once per worker: what the config does that its operator may not mean
        (a ``max_concurrent`` below the workers: proxy/config/advice.py)."""
        for line in limit_advice(config, self.count):
            log.warning("%s", line)

    async def _stop(self) -> None:
        self.notifier.stopping()
        for w in self.workers:
            if w.alive and w.proc is not None:
                w.proc.send_signal(signal.SIGTERM)
        procs = [w.proc.wait() for w in self.workers if w.proc is not None]
        try:
            await asyncio.wait_for(asyncio.gather(*procs), self.config.shutdown_grace + 10)
        except TimeoutError:
            for w in self.workers:
                if w.alive and w.proc is not None:
                    log.error("worker %d did not stop within the grace: killed", w.index)
                    w.proc.kill()
            await asyncio.gather(*(w.proc.wait() for w in self.workers if w.proc is not None))

    async def _all_ready(self) -> None:
        await asyncio.gather(*(w.ready.wait() for w in self.workers))

    async def serve(self) -> int:
        loop = asyncio.get_running_loop()
        for w in self.workers:
            loop.add_reader(w.sock.fileno(), w.read_notes)
        reloading: set[asyncio.Task[bool]] = set()

        def on_hup() -> None:
            task = loop.create_task(self.reload())
            reloading.add(task)
            task.add_done_callback(reloading.discard)

        loop.add_signal_handler(signal.SIGHUP, on_hup)
        loop.add_signal_handler(signal.SIGTERM, self.stopping.set)
        loop.add_signal_handler(signal.SIGINT, self.stopping.set)
        try:
            await _preload()
            self._advise(self.config)
            for w in self.workers:
                await self._spawn(w)
            watches = [loop.create_task(self._watch(w)) for w in self.workers]
            ready = loop.create_task(self._all_ready())
            stop = loop.create_task(self.stopping.wait())
            await asyncio.wait([ready, stop], timeout=START_TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
            if not stop.done():
                self._all_ready_once = True
                log.info("%d workers listening on %s", self.count, self.listen)
                self.notifier.ready()
                self._status()
                watchdog = loop.create_task(self._watchdog())
                await stop
                watchdog.cancel()
            ready.cancel()
            await self._stop()
            for task in watches:
                task.cancel()
        finally:
            for w in self.workers:
                loop.remove_reader(w.sock.fileno())
                w.sock.close()
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self.notifier.close()
        if self.failed:
            log.error("%s", self.failed)
            return 1
        log.info("stopped")
        return 0
