"""The simulated provider as a transport: the walker calls it like any upstream, with no network.

Registered for ``kind: simulated`` by the provider registry (``proxy/providers/simulated.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

from ..config import Provider
from ..upstream.transport import Upstream, UpstreamRequest
from .simulator import Simulator


class SimUpstream:
    """A simulated answer. A deadline or a drain's cut wakes a read waiting on the simulator with
    the reason, as it wakes a read from a socket."""

    __slots__ = ("_aborted", "_body", "_reading", "_stream", "headers", "status")

    def __init__(self, status: int, headers: Mapping[str, str], body: bytes | None,
                 stream: AsyncIterator[bytes] | None) -> None:
        self.status = status
        self.headers = headers
        self._body = body
        self._stream = stream
        self._aborted: BaseException | None = None
        self._reading: asyncio.Task[object] | None = None

    async def chunk(self) -> bytes:
        if self._aborted is not None:
            raise self._aborted
        if self._body is not None:
            body, self._body = self._body, b""
            return body
        if self._stream is None:
            return b""
        self._reading = asyncio.current_task()
        try:
            return await anext(self._stream)
        except StopAsyncIteration:
            self._stream = None
            return b""
        except asyncio.CancelledError:
            aborted, task = self._aborted, self._reading
            if aborted is None or task is None or task.uncancel():
                raise  # not ours: the client left, or the loop is closing
            self._stream = None
            raise aborted from None
        finally:
            self._reading = None

    async def read(self, limit: int) -> bytes:
        parts = []
        while data := await self.chunk():
            parts.append(data)
        return b"".join(parts)

    def at_eof(self) -> bool:
        return not self._body and self._stream is None

    def abort(self, exc: BaseException) -> None:
        self._aborted = exc
        if self._reading is not None:
            self._reading.cancel()

    def close(self) -> None:
        self._stream = None


class SimTransport:
    """The in-process simulated provider: one Simulator per provider name."""

    def __init__(self) -> None:
        self.simulators: dict[str, Simulator] = {}

    def simulator(self, provider: Provider) -> Simulator:
        sim = self.simulators.get(provider.name)
        if sim is None or sim.knobs != provider.simulate:
            sim = self.simulators[provider.name] = Simulator(provider.simulate, name=provider.name)
        return sim

    async def send(self, provider: Provider, req: UpstreamRequest) -> Upstream:
        answer = await self.simulator(provider).answer(req.extra["op"], req.extra["json"])
        return SimUpstream(answer.status, answer.headers, answer.body, answer.stream)
