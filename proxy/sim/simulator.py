"""A stand-in LLM provider that answers in the OpenAI shape with tunable timing.

One implementation serves two uses: the in-process ``kind: simulated``
provider (no network, so ``scripts/serve`` works with no keys) and
``firstbyte simulate --port N``, which puts the same answers on real HTTP for
benchmarks and the routing-quality harness.
"""

from __future__ import annotations

import asyncio
import heapq
import random
import time
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from ..config import Simulate
from ..translate.sse import DONE, data_frame
from ..translate.usage import counted
from .script import Script, needs_script, script_for


@dataclass(slots=True)
class SimAnswer:
    status: int
    headers: dict[str, str]
    body: bytes | None  # a buffered answer or an error
    stream: AsyncIterator[bytes] | None  # an SSE answer, paced


class Simulator:
    """Answers chat, completions and embeddings; ``knobs`` may follow a schedule."""

    def __init__(
        self,
        knobs: Simulate,
        *,
        name: str = "sim",
        schedule: Callable[[float], Simulate] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.knobs = knobs
        self.name = name
        self.schedule = schedule
        self.clock = clock
        self.started = clock()
        self.rng = random.Random(knobs.seed)
        self.served = 0
        self.stalled = 0
        self.cold: int | None = None  # calls begun before the first first chunk went out (a cold start's flood)
        self._due: list[float] = []  # when each call still waiting for its first chunk gets it (a heap)

    def current(self) -> Simulate:
        if self.schedule is None:
            return self.knobs
        return self.schedule(self.clock() - self.started)

    def _first_delay(self, knobs: Simulate) -> float:
        """Seconds until this call's first chunk: ``first_chunk_ms`` and its jitter; with
        ``stall_rate``, sometimes ``stall_ms`` more; with ``load_ms``, that much more for each earlier
        call still waiting for its own first chunk (a provider slowing with its own concurrency)."""
        jitter = self.rng.uniform(-knobs.jitter_ms, knobs.jitter_ms) if knobs.jitter_ms else 0.0
        ms = max(0.0, knobs.first_chunk_ms + jitter)
        if knobs.stall_rate and self.rng.random() < knobs.stall_rate:
            self.stalled += 1
            ms += knobs.stall_ms
        if knobs.load_ms or self._due:
            now = self.clock()
            due = self._due
            while due and due[0] <= now:
                heapq.heappop(due)
            ms += knobs.load_ms * len(due)
            if knobs.load_ms:
                heapq.heappush(due, now + ms / 1000.0)
        return ms / 1000.0

    async def answer(self, op: str, body: dict[str, Any]) -> SimAnswer:
        knobs = self.current()
        delay = self._first_delay(knobs)
        model = body.get("model") or self.name
        if knobs.fail_rate and self.rng.random() < knobs.fail_rate:
            await asyncio.sleep(delay / 2)
            message = f"simulated failure of {self.name} (fail_rate {knobs.fail_rate:g})"
            err = {"error": {"message": message, "type": "server_error", "param": None,
                             "code": "simulated"}}
            return SimAnswer(knobs.fail_status, _JSON, orjson.dumps(err), None)
        self.served += 1
        if op == "embeddings":
            await asyncio.sleep(delay)
            refused = _too_many_inputs(body)
            if refused is not None:
                return SimAnswer(400, _JSON, refused, None)
            return SimAnswer(200, _JSON, orjson.dumps(_embeddings(body, model)), None)
        prompt_tokens = _prompt_tokens(body)
        words = [f"tok{i} " for i in range(knobs.chunks)]
        if needs_script(body, knobs.chunks):  # tools, JSON, n, stop, max_tokens: answer as a model would
            script = script_for(op, body, words, self.served)
            if body.get("stream"):
                usage = bool((body.get("stream_options") or {}).get("include_usage"))
                stream = _script_stream(op, model, script, delay, knobs.chunk_ms / 1000.0, prompt_tokens,
                                        usage)
                return SimAnswer(200, _SSE, None, stream)
            steps = max(c.tokens for c in script.choices)
            await asyncio.sleep(delay + steps * knobs.chunk_ms / 1000.0)
            return SimAnswer(200, _JSON, orjson.dumps(_script_buffered(op, model, script, prompt_tokens)), None)
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            stream = _stream(op, model, words, delay, knobs.chunk_ms / 1000.0, prompt_tokens, usage, self)
            return SimAnswer(200, _SSE, None, stream)
        await asyncio.sleep(delay + knobs.chunks * knobs.chunk_ms / 1000.0)
        self._first_out()
        return SimAnswer(200, _JSON, orjson.dumps(_buffered(op, model, words, prompt_tokens)), None)

    def _first_out(self) -> None:
        if self.cold is None:
            self.cold = self.served


_JSON = {"content-type": "application/json"}
_SSE = {"content-type": "text/event-stream", "cache-control": "no-cache"}


def _prompt_tokens(body: dict[str, Any]) -> int:
    """A rough prompt size. ``messages`` is a list here on chat (the edge checked it), but a body of
    another endpoint may carry anything under that name."""
    messages = body.get("messages")
    if isinstance(messages, list):
        text = "".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        if "tools" in body:
            text += str(body["tools"])
    else:
        text = str(body.get("prompt", ""))
    return max(1, len(text) // 4)


def _buffered(op: str, model: str, words: list[str], prompt: int) -> dict[str, Any]:
    text = "".join(words)
    if op == "completions":
        return {"id": "cmpl-sim", "object": "text_completion", "created": int(time.time()),
                "model": model, "choices": [{"index": 0, "text": text, "finish_reason": "stop",
                                             "logprobs": None}],
                "usage": counted(prompt, len(words))}
    return {"id": "chatcmpl-sim", "object": "chat.completion", "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop"}],
            "usage": counted(prompt, len(words))}


def _chunk(op: str, model: str, created: int, text: str | None, finish: str | None,
           first: bool) -> bytes:
    if op == "completions":
        choice: dict[str, Any] = {"index": 0, "text": text or "", "finish_reason": finish,
                                  "logprobs": None}
        data = {"id": "cmpl-sim", "object": "text_completion", "created": created,
                "model": model, "choices": [choice]}
    else:
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        data = {"id": "chatcmpl-sim", "object": "chat.completion.chunk", "created": created,
                "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return data_frame(data)


async def _stream(op: str, model: str, words: list[str], delay: float, pace: float,
                  prompt: int, usage: bool, sim: Simulator | None = None) -> AsyncIterator[bytes]:
    created = int(time.time())
    await asyncio.sleep(delay)
    if sim is not None:
        sim._first_out()
    for i, word in enumerate(words):
        if i:
            await asyncio.sleep(pace)
        yield _chunk(op, model, created, word, None, i == 0)
    yield _chunk(op, model, created, None, "stop", False)
    if usage:
        obj = "chat.completion.chunk" if op != "completions" else "text_completion"
        data = {"id": "chatcmpl-sim", "object": obj, "created": created, "model": model,
                "choices": [], "usage": counted(prompt, len(words))}
        yield data_frame(data)
    yield DONE


# OpenAI's own bound on an embeddings call's inputs. The simulator answers past it as OpenAI does
# (a 400), and so bounds its work: each input is computed on the event loop, and three calls of
# 200,000 inputs held it (and /healthz beside it) for 3.7 s.
MAX_EMBEDDING_INPUTS = 2048


def _too_many_inputs(body: dict[str, Any]) -> bytes | None:
    """OpenAI's 400 for an ``input`` array past ``MAX_EMBEDDING_INPUTS``; None when it fits."""
    raw = body.get("input")
    if not isinstance(raw, list) or len(raw) <= MAX_EMBEDDING_INPUTS:
        return None
    message = (f"Invalid 'input': an array of at most {MAX_EMBEDDING_INPUTS} inputs, got {len(raw)}; "
               "split the call.")
    return orjson.dumps({"error": {"message": message, "type": "invalid_request_error", "param": "input",
                                   "code": "array_above_max_length"}})


def _embeddings(body: dict[str, Any], model: str) -> dict[str, Any]:
    raw = body.get("input", "")
    inputs = raw if isinstance(raw, list) else [raw]
    data = []
    for i, item in enumerate(inputs):
        seed = zlib.crc32(str(item).encode()) or 1  # C-speed over a long input (``sum`` was per byte)
        vector = [((seed * (k + 1)) % 1000) / 1000.0 for k in range(8)]
        data.append({"object": "embedding", "index": i, "embedding": vector})
    tokens = sum(max(1, len(str(x)) // 4) for x in inputs)
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def _tool_calls(choice_calls: list[Any], whole: bool) -> list[dict[str, Any]]:
    return [{"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": "".join(c.arguments) if whole else ""}}
            for c in choice_calls]


def _script_buffered(op: str, model: str, script: Script, prompt: int) -> dict[str, Any]:
    created = int(time.time())
    usage = counted(prompt, script.tokens)
    if op == "completions":
        return {"id": "cmpl-sim", "object": "text_completion", "created": created, "model": model,
                "choices": [{"index": i, "text": "".join(c.pieces), "finish_reason": c.finish, "logprobs": None}
                            for i, c in enumerate(script.choices)],
                "usage": usage}
    choices = []
    for i, c in enumerate(script.choices):
        message: dict[str, Any] = {"role": "assistant", "content": "".join(c.pieces) if c.pieces or not c.calls
                                   else None}
        if c.calls:
            message["tool_calls"] = _tool_calls(c.calls, True)
        choices.append({"index": i, "message": message, "finish_reason": c.finish})
    return {"id": "chatcmpl-sim", "object": "chat.completion", "created": created, "model": model,
            "choices": choices, "usage": usage}


def _script_chunk(op: str, model: str, created: int, index: int, delta: dict[str, Any] | str,
                  finish: str | None) -> bytes:
    if op == "completions":
        data: dict[str, Any] = {"id": "cmpl-sim", "object": "text_completion", "created": created, "model": model,
                                "choices": [{"index": index, "text": delta, "finish_reason": finish,
                                             "logprobs": None}]}
    else:
        data = {"id": "chatcmpl-sim", "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": index, "delta": delta, "finish_reason": finish}]}
    return data_frame(data)


async def _script_stream(op: str, model: str, script: Script, delay: float, pace: float,
                         prompt: int, usage: bool) -> AsyncIterator[bytes]:
    """The choices side by side, one piece of each per step, as OpenAI interleaves them."""
    created = int(time.time())
    steps: list[list[bytes]] = []
    for index, c in enumerate(script.choices):
        events: list[bytes] = []
        for k, piece in enumerate(c.pieces):
            delta: dict[str, Any] | str = piece if op == "completions" else (
                {"role": "assistant", "content": piece} if k == 0 else {"content": piece})
            events.append(_script_chunk(op, model, created, index, delta, None))
        for n, call in enumerate(c.calls):
            head = {"index": n, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
            first: dict[str, Any] = {"tool_calls": [head]}
            if not events:
                first["role"] = "assistant"
                first["content"] = None
            events.append(_script_chunk(op, model, created, index, first, None))
            for piece in call.arguments:
                events.append(_script_chunk(op, model, created, index,
                                            {"tool_calls": [{"index": n, "function": {"arguments": piece}}]}, None))
        events.append(_script_chunk(op, model, created, index, "" if op == "completions" else {}, c.finish))
        steps.append(events)
    await asyncio.sleep(delay)
    for step in range(max(len(e) for e in steps)):
        if step:
            await asyncio.sleep(pace)
        yield b"".join(events[step] for events in steps if step < len(events))
    if usage:
        obj = "chat.completion.chunk" if op != "completions" else "text_completion"
        data = {"id": "chatcmpl-sim", "object": obj, "created": created, "model": model,
                "choices": [], "usage": counted(prompt, script.tokens)}
        yield data_frame(data)
    yield DONE
