"""``firstbyte simulate``: the simulated provider on real HTTP, called as a real provider would be."""

from __future__ import annotations

import asyncio
import io
import json
import sys
from pathlib import Path
from typing import Any

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


async def test_embedding_calls_past_openais_input_bound_are_refused_without_holding_the_loop(proxy) -> None:
    """A reviewer's three embedding calls of 200,000 inputs each to the simulated provider held the
    event loop, and /healthz beside them, for 3.7 s (each input computed in Python). The simulator
    answers past OpenAI's own bound (2,048 inputs) as OpenAI does, a 400, and a call within it stays
    cheap. (The large calls are raw aiohttp: the SDK takes seconds to build such a body.)"""
    import time

    from proxy.sim.simulator import MAX_EMBEDDING_INPUTS

    p = await proxy({"max_body_bytes": 64 * 1024 * 1024, "providers": {"sim": {"kind": "simulated"}},
                     "routes": {"emb": {"targets": [{"provider": "sim", "model": "m"}]}}})
    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="k", max_retries=0)
    worst = 0.0
    done = asyncio.Event()

    async def probe() -> None:
        nonlocal worst
        async with aiohttp.ClientSession() as session:
            while not done.is_set():
                t0 = time.monotonic()
                async with session.get(p.url + "/healthz") as resp:
                    assert resp.status == 200
                worst = max(worst, time.monotonic() - t0)
                await asyncio.sleep(0.02)

    body = json.dumps({"model": "emb", "input": ["hello world"] * 200_000}).encode()

    async def too_many() -> dict[str, Any]:
        async with aiohttp.ClientSession() as session, session.post(p.url + "/v1/embeddings",
                                                                            data=io.BytesIO(body)) as resp:
            assert resp.status == 400
            return (await resp.json())["error"]

    prober = asyncio.create_task(probe())
    try:
        await asyncio.sleep(0.05)
        refusals = await asyncio.gather(*(too_many() for _ in range(3)))
    finally:
        done.set()
        await prober
    try:
        fits = await client.embeddings.create(model="emb", input=["hello world"] * MAX_EMBEDDING_INPUTS)
    finally:
        await client.close()
    assert {r["code"] for r in refusals} == {"array_above_max_length"}
    assert "at most 2048 inputs, got 200000" in refusals[0]["message"]
    assert len(fits.data) == MAX_EMBEDDING_INPUTS
    # the three calls' own parsing and checks share the loop (and this test's clients do too, on a busy
    # machine): the bound is on the simulator's part, which alone took 3.7 s on an idle one
    assert worst < 1.5, f"/healthz waited {worst:.2f} s behind the embedding calls"
