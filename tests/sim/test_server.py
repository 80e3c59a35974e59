"""``firstbyte simulate``: the simulated provider on real HTTP, called as a real provider would be."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import aiohttp
import openai
import pytest


async def test_simulate_serves_the_openai_shape_over_http(tmp_path: Path, unused_tcp_port: int) -> None:
    schedule = tmp_path / "schedule.json"
    schedule.write_text(json.dumps([{"at": 0, "chunks": 3}, {"at": 3600, "chunks": 9}]))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy.cli", "simulate", "--port", str(unused_tcp_port),
        "--first-chunk-ms", "5", "--jitter-ms", "0", "--chunk-ms", "1", "--chunks", "5",
        "--schedule", str(schedule), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 10)
        assert b"simulated provider on" in line
        base = f"http://127.0.0.1:{unused_tcp_port}/v1"
        async with openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=0) as client:
            chat = await client.chat.completions.create(model="sim-x", messages=[{"role": "user", "content": "hi"}])
            assert chat.choices[0].message.content == "tok0 tok1 tok2 "  # the schedule's 3 chunks
            assert chat.model == "sim-x"
            stream = await client.chat.completions.create(
                model="sim-x", messages=[{"role": "user", "content": "hi"}], stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [c async for c in stream]
            assert [c.choices[0].delta.content for c in chunks if c.choices][:3] == ["tok0 ", "tok1 ", "tok2 "]
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
            emb = await client.embeddings.create(model="sim-e", input="abc")
            assert len(emb.data[0].embedding) == 8
        async with aiohttp.ClientSession() as session, session.get(base[:-3] + "/sim/stats") as resp:
            stats = await resp.json()
        assert stats["served"] == 3
        assert stats["cold"] == 1 and stats["stalled"] == 0  # one call had begun when the first chunk went out
        # A harness that started its processes slowly starts the schedule and the counts again.
        async with aiohttp.ClientSession() as session:
            async with session.post(base[:-3] + "/sim/restart") as resp:
                assert resp.status == 200
            async with session.get(base[:-3] + "/sim/stats") as resp:
                again = await resp.json()
        assert (again["served"], again["cold"], again["stalled"]) == (0, None, 0)
        assert again["elapsed_s"] < stats["elapsed_s"]
    finally:
        proc.terminate()
        await proc.wait()


def test_a_stall_share_delays_that_share_of_first_chunks() -> None:
    from proxy.config import Simulate
    from proxy.sim.simulator import Simulator

    sim = Simulator(Simulate(first_chunk_ms=20, jitter_ms=0, stall_rate=0.1, stall_ms=1500, seed=3))
    delays = [sim._first_delay(sim.knobs) for _ in range(2000)]
    stalled = [d for d in delays if d > 1.0]
    assert set(delays) == {0.02, 1.52}
    assert 150 <= len(stalled) <= 250 and sim.stalled == len(stalled)
    plain = Simulator(Simulate(first_chunk_ms=20, jitter_ms=0, seed=3))
    assert {plain._first_delay(plain.knobs) for _ in range(100)} == {0.02} and plain.stalled == 0


def test_a_loaded_simulator_slows_with_the_calls_still_waiting_for_their_first_chunk() -> None:
    from proxy.config import Simulate
    from proxy.sim.simulator import Simulator

    now = [100.0]
    sim = Simulator(Simulate(first_chunk_ms=20, jitter_ms=0, load_ms=10), clock=lambda: now[0])
    assert sim._first_delay(sim.knobs) == 0.02  # alone: due at 100.02
    assert sim._first_delay(sim.knobs) == 0.03  # one waiting: due at 100.03
    assert sim._first_delay(sim.knobs) == 0.04  # two waiting: due at 100.04
    now[0] = 100.025  # the first has had its first chunk
    assert sim._first_delay(sim.knobs) == pytest.approx(0.04)  # two still waiting
    now[0] = 101.0
    assert sim._first_delay(sim.knobs) == 0.02  # all done: unloaded again
