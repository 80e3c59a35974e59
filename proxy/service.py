"""Running firstbyte as a service: listen, reload on SIGHUP, drain on SIGTERM.

The event loop is uvloop where it is installed. A reload that fails keeps the
old config serving and logs every problem. SIGTERM stops accepting, turns
/readyz to 503, lets requests in flight finish within ``shutdown_grace``,
cancels what is left and exits 0. systemd hears about each step through the
notify protocol when it started us with ``NOTIFY_SOCKET``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any

from aiohttp import web

from .box import LOCAL_METRICS, Box
from .config import Config, load_config, split_listen
from .errors import ConfigError
from .gateway import Gateway
from .memory import hold_mmap_threshold
from .observe.hub import Hub
from .sdnotify import Notifier
from .server.app import build_app
from .server.listener import Guard, GuardedRunner, fd_budget, raise_fd_limit
from .server.ops import build_ops_app, own_metrics
from .server.replies import GATEWAY, HUB

log = logging.getLogger("firstbyte")


# A relayed call allocates a few hundred short-lived objects; nearly all are freed by reference
# counting, so the cyclic collector's default first threshold (700) runs it every few requests for
# little. Measured with scripts/instructions: 2-4 % of a relayed call.
GC_THRESHOLDS = (20_000, 50, 100)


def run(main: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """Run the service on uvloop when it is available, with the collector tuned for a server:
    what was imported is frozen out of its scans, and its first generation is larger."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    hold_mmap_threshold()  # a large event's freed pages go back to the system (proxy/memory.py)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(main())
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main())


class Service:
    def __init__(self, config_path: str, config: Config, listen: str | None = None, box: Box | None = None) -> None:
        self.config_path = config_path
        self.listen = listen or config.listen
        self.hub = Hub(config)
        self.started = config  # what the keys a reload cannot change (listen, state, ...) still say
        self.gateway = Gateway(config, observers=self.hub.observers)
        self.gateway.box = box  # a worker: its own SO_REUSEPORT socket, its share of connections.max
        self.notifier = Notifier()
        self.stopping = asyncio.Event()
        self.runners: list[web.AppRunner] = []
        self._reloading: asyncio.Task[None] | None = None
        self._again = False  # a SIGHUP came while a reload ran
        self._lock = asyncio.Lock()

    async def reload(self) -> bool:
        """Re-read the file; swap it in whole, or keep the running one and say why.

        A reload that fails for any reason (the file, the YAML, a bug) is refused the same way: one
        log line with the reason, ``firstbyte_config_reloads_total{result="refused"}`` and the
        ``last_reload_successful`` gauge at 0; it never escapes as an unretrieved task exception."""
        async with self._lock:
            self.notifier.reloading()
            try:
                try:
                    config = await asyncio.to_thread(load_config, self.config_path)
                except ConfigError as exc:
                    return self._refused(str(exc))
                except Exception as exc:
                    return self._refused(f"{type(exc).__name__}: {exc} (a firstbyte bug)", bug=True)
                return await self._adopt(config)
            finally:
                self.notifier.ready()

    async def _adopt(self, config: Config) -> bool:
        """Swap in a loaded config; when that fails midway, put the running one back."""
        old, runs = self.gateway.config, self.started
        fixed = {"listen": (config.listen, runs.listen), "ops_listen": (config.ops_listen, runs.ops_listen),
                 "shutdown_grace": (config.shutdown_grace, runs.shutdown_grace),
                 "connections": (config.connections, runs.connections), "state": (config.state, runs.state)}
        try:
            self.gateway.apply(config)
            await self.hub.reconfigure(config, self.gateway.outbox)
        except Exception as exc:
            try:
                self.gateway.apply(old)
                await self.hub.reconfigure(old, self.gateway.outbox)
            except Exception:
                log.exception("putting the running config back failed too")
            bug = not isinstance(exc, OSError)  # a log file that cannot open is the file's news, not a bug
            return self._refused(f"applying it failed: {type(exc).__name__}: {exc}" + (" (a firstbyte bug)" * bug),
                                 bug=bug)
        for key, (new, was) in fixed.items():
            if new != was:
                log.warning("%s changed: takes effect on restart", key)
        self.gateway.loaded.taken()
        log.info("reloaded %s: %d routes", self.config_path, len(config.routes))
        return True

    def _refused(self, reason: str, bug: bool = False) -> bool:
        log.error("reload refused, the running config stays: %s", reason, exc_info=bug)
        self.gateway.loaded.refused()  # firstbyte_config_last_reload_successful 0
        return False

    def _on_sighup(self) -> None:
        """A SIGHUP during a reload is not dropped: one more reload runs after it (the file may
        have changed again since the running one read it); more signals meanwhile fold into it."""
        if self._reloading is None or self._reloading.done():
            self._reloading = asyncio.get_running_loop().create_task(self._reload_until_quiet())
        else:
            self._again = True

    async def _reload_until_quiet(self) -> None:
        while True:
            self._again = False
            await self.reload()
            if not self._again:
                return

    async def _start_site(self, app: web.Application, listen: str, name: str) -> None:
        box = self.gateway.box
        connections = self.gateway.config.connections
        if box is not None:  # connections.max holds for the box: each worker takes an even share
            connections = replace(connections, max=max(1, connections.max // box.count))
        guard = Guard(connections, name)
        self.hub.connections.append(guard)  # counted on /metrics
        runner = GuardedRunner(
            app,
            guard,
            internals=self.gateway.internals,
            handler_cancellation=True,
            shutdown_timeout=self.gateway.config.shutdown_grace,
            access_log=None,
        )
        await runner.setup()
        self.runners.append(runner)
        host, port = split_listen(listen)
        await web.TCPSite(runner, host, port, backlog=4096, reuse_address=True, reuse_port=box is not None).start()
        log.info("listening on http://%s:%d (at most %d client connections%s)", host, port, guard.max,
                 f", worker {box.index} of {box.count}" if box is not None else "")

    async def _start_private(self, box: Box) -> None:
        """The worker's private socket: its own /metrics, asked by the worker a scrape reaches."""
        app = web.Application()
        app[GATEWAY] = self.gateway
        app[HUB] = self.hub
        app.router.add_get(LOCAL_METRICS, own_metrics)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1)
        await runner.setup()
        self.runners.append(runner)
        path = box.socket(box.index)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # the socket of the worker this one replaces
        await web.UnixSite(runner, path).start()

    def _cut_streams(self) -> None:
        cut = self.gateway.cut_streams()
        if cut:
            log.warning("drain: the grace is over, %d stream(s) ended with an error event", cut)

    async def serve(self) -> int:
        gw = self.gateway
        await self.hub.start()
        await gw.start()
        try:
            soft = raise_fd_limit()
            if fd_budget() < gw.config.connections.max:
                log.warning("RLIMIT_NOFILE %d carries %d client connections, under connections.max %d",
                            soft, fd_budget(), gw.config.connections.max)
            await self._start_site(build_app(gw, self.hub, manage=False), self.listen, "main")
            if gw.config.ops_listen:
                await self._start_site(build_ops_app(gw, self.hub), gw.config.ops_listen, "ops")
            if gw.box is not None:
                await self._start_private(gw.box)
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGHUP, self._on_sighup)
            loop.add_signal_handler(signal.SIGTERM, self.stopping.set)
            loop.add_signal_handler(signal.SIGINT, self.stopping.set)
            loop_kind = type(loop).__module__.split(".")[0]
            log.info("firstbyte ready (config %s, %d routes, event loop %s)", self.config_path,
                     len(gw.config.routes), loop_kind)
            self.notifier.ready()
            watchdog = asyncio.create_task(self.notifier.run_watchdog())
            await self.stopping.wait()
            log.info("draining: requests in flight get %.0fs", gw.config.shutdown_grace)
            gw.draining = True
            self.notifier.stopping()
            watchdog.cancel()
            # The main listener stops accepting and waits for its requests up to the grace; then
            # the streams still relayed are ended with an error event that says so (aiohttp's own
            # shutdown would give the handlers the grace twice, then cut them without a word);
            # the ops listener (if any) answers /readyz 503 meanwhile.
            cut = loop.call_later(gw.config.shutdown_grace, self._cut_streams)
            try:
                for runner in self.runners:
                    await runner.cleanup()
            finally:
                cut.cancel()
        finally:
            try:
                try:
                    await gw.close()  # hands the observers what finished during the drain
                finally:
                    await self.hub.close()  # then the access log and ledger write out
            finally:
                self.notifier.close()
        log.info("stopped")
        return 0
