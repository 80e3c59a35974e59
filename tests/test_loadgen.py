"""scripts/loadgen.py's ``rounds``: concurrency 1, every target once per round, over real loopback HTTP."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from .conftest import FakeUpstream, chat_body

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


@pytest.fixture
def loadgen() -> Iterator[Any]:
    sys.path.insert(0, str(SCRIPTS))
    try:
        import bench  # the load generator's driver, as scripts/bench uses it
    finally:
        sys.path.remove(str(SCRIPTS))
    gen = bench.Loadgen()
    try:
        yield gen
    finally:
        gen.close()


async def test_rounds_call_every_target_once_per_round_in_turn(loadgen: Any) -> None:
    async def answer(request: web.Request) -> web.Response:
        return web.json_response(chat_body())

    up = await FakeUpstream({"/a": answer, "/b": answer, "/c": answer}).start()
    try:
        cmd = {"op": "rounds", "urls": {n: f"{up.url}/{n}" for n in "abc"},
               "bodies": {n: {"model": f"m-{n}"} for n in "abc"}, "stream": False, "requests": 6, "warmup": 2}
        # The driver blocks on the process's stdout; the upstream needs this loop meanwhile.
        result = await asyncio.to_thread(loadgen.call, cmd)
    finally:
        await up.stop()

    paths = [c["path"] for c in up.calls]
    assert len(paths) == 3 * 8  # (warm-up + counted rounds) x targets
    rounds = [paths[i:i + 3] for i in range(0, len(paths), 3)]
    assert all(sorted(r) == ["/a", "/b", "/c"] for r in rounds), rounds  # each target once per round
    assert len({tuple(r) for r in rounds}) > 1  # in a shuffled order, not a fixed one
    assert all(c["json"] == {"model": "m" + c["path"].replace("/", "-"), "stream": False} for c in up.calls)
    for name in "abc":  # only the counted rounds are reported, each with its own time
        assert len(result[name]["lat"]) == len(result[name]["ttfc"]) == 6
        assert result[name]["errors"] == 0
        assert result[name]["elapsed"] == pytest.approx(sum(result[name]["lat"]))
