"""Running firstbyte as a service: listen, reload on SIGHUP, drain on SIGTERM.

The event loop is uvloop where it is installed. A reload that fails keeps the old
config serving and logs every problem; SIGTERM stops accepting, turns /readyz to
503, lets streams in flight finish within ``shutdown_grace`` and exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import web

from .config import Config, load_config, split_listen
from .errors import ConfigError
from .gateway import Gateway
from .observe import Observer
from .sdnotify import Notifier
from .server import build_app

log = logging.getLogger("firstbyte")


def run(coro_fn: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """Run the service on uvloop when it is available."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(coro_fn())
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro_fn())


def make_observers(config: Config) -> list[Observer]:
    from .observe.accesslog import AccessLog

    observers: list[Observer] = [AccessLog(config.access_log)]
    return observers


class Service:
    def __init__(self, config_path: str, config: Config, listen: str | None = None) -> None:
        self.config_path = config_path
        self.listen = listen or config.listen
        self.gateway = Gateway(config, observers=make_observers(config))
        self.notifier = Notifier()  # reads NOTIFY_SOCKET from the environment
        self.stopping = asyncio.Event()
        self.runner: web.AppRunner | None = None

    def reload(self) -> bool:
        self.notifier.reloading()
        try:
            config = load_config(self.config_path)
        except ConfigError as exc:
            log.error("reload refused, the running config stays: %s", exc)
            self.notifier.ready()
            return False
        if config.listen != self.gateway.config.listen:
            log.warning("listen changed to %s: takes effect on restart", config.listen)
        self.gateway.apply(config)
        log.info("reloaded %s: %d routes", self.config_path, len(config.routes))
        self.notifier.ready()
        return True

    async def serve(self) -> int:
        gw = self.gateway
        app = build_app(gw)
        self.runner = web.AppRunner(
            app,
            handler_cancellation=True,
            shutdown_timeout=gw.config.shutdown_grace,
            access_log=None,
        )
        await self.runner.setup()
        host, port = split_listen(self.listen)
        site = web.TCPSite(self.runner, host, port, backlog=2048, reuse_address=True)
        await site.start()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        loop.add_signal_handler(signal.SIGTERM, self.stopping.set)
        loop.add_signal_handler(signal.SIGINT, self.stopping.set)
        log.info("firstbyte listening on http://%s:%d (config %s)", host, port, self.config_path)
        self.notifier.ready()
        watchdog = asyncio.create_task(self.notifier.run_watchdog())
        try:
            await self.stopping.wait()
        finally:
            log.info("draining: in-flight requests get %.0fs", gw.config.shutdown_grace)
            gw.draining = True
            self.notifier.stopping()
            watchdog.cancel()
            await self.runner.cleanup()
        return 0
