"""What judging a JSON answer's depth and containers costs: the byte reader firstbyte uses, against a walk.

Bounded (best of a few runs of each, a few seconds in all); process time, so a busy box inflates less.

    .venv/bin/python scripts/depth_cost.py
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import orjson

from proxy.bounds import (
    MAX_ANSWER_CONTAINERS,
    MAX_CHUNK_DEPTH,
    MAX_EVENT_CONTAINERS,
    containers_past,
    deeper_than,
    json_deeper_than,
)
from proxy.walk.classify import outsized

WORDS = ["the", " cat", " sat", " on", " a", " mat", ",", " and", "ing", "\n", ' "', " [1]", "{", " it", " was"]


def logprobs_answer(size: int, seed: int = 1) -> bytes:
    """A chat answer with logprobs (5 alternatives a token) of about ``size`` bytes."""
    rng = random.Random(seed)

    def token() -> dict[str, object]:
        text = rng.choice(WORDS)
        return {"token": text, "logprob": -rng.random() * 5, "bytes": list(text.encode())}

    content: list[dict[str, object]] = []
    while len(content) % 100 or len(orjson.dumps(content)) < size:
        content.append({**token(), "top_logprobs": [token() for _ in range(5)]})
    text = "".join(str(c["token"]) for c in content)
    return orjson.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": {"content": content},
         "finish_reason": "stop"}], "usage": {"prompt_tokens": 9, "completion_tokens": len(content),
                                              "total_tokens": 9 + len(content)}})


def best_ms(run: Callable[[], object], times: int) -> float:
    best = float("inf")
    for _ in range(times):
        started = time.process_time()
        run()
        best = min(best, time.process_time() - started)
    return best * 1e3


def main() -> None:
    normal = orjson.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Hello there! " * 60}, "finish_reason": "stop"}]})
    answers = {"normal chat answer": normal, "logprobs answer": logprobs_answer(800_000)}
    for name, raw in answers.items():
        report(name, raw)


def report(name: str, raw: bytes) -> None:
    parsed = orjson.loads(raw)
    times = 200 if len(raw) < 10_000 else 10
    rows = [("firstbyte's check (walk/classify.outsized: depth, containers)", lambda: outsized(raw)),
            ("a buffered answer's containers alone (containers_past)",
             lambda: containers_past(raw, MAX_ANSWER_CONTAINERS)),
            ("as if it were one streamed event (containers_past)", lambda: containers_past(raw, MAX_EVENT_CONTAINERS)),
            ("json_deeper_than alone", lambda: json_deeper_than(raw, MAX_CHUNK_DEPTH)),
            ("walk of the parsed value (deeper_than)", lambda: deeper_than(parsed, MAX_CHUNK_DEPTH)),
            ("orjson.loads, for scale", lambda: orjson.loads(raw))]
    print(f"{name}: {len(raw):,} bytes, {raw.count(b'[') + raw.count(b'{'):,} brackets")
    for what, run in rows:
        print(f"  {what:62s} {best_ms(run, times):8.3f} ms")

if __name__ == "__main__":
    main()
