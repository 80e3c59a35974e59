"""What a piece of code costs in Python function calls: a walk of parsed containers makes one a container,
C-speed byte passes a handful. A count, not a clock, so a busy machine cannot make it flaky."""

from __future__ import annotations

import sys
from collections.abc import Callable

import orjson


def python_calls(run: Callable[[], object]) -> int:
    """Python function calls ``run`` makes (a C function's are not counted): what a walk of parsed
    containers costs, one generator a container, where C-speed byte passes cost a handful."""
    calls = 0

    def count(frame: object, what: str, arg: object) -> None:
        nonlocal calls
        calls += what == "call"

    sys.setprofile(count)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls


def logprobs_chunk(tokens: int) -> bytes:
    """A streamed chunk carrying many tokens' logprobs: long, bushy (thousands of containers), shallow."""
    top = [{"token": "b", "logprob": -1.5, "bytes": [98]}] * 5
    logprobs = {"content": [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": top}] * tokens}
    payload = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [{"index": 0, "delta": {"content": "a" * tokens}, "logprobs": logprobs}]}
    return b"data: " + orjson.dumps(payload) + b"\n\n"

