"""Every bound on what a client or an upstream can make firstbyte hold or wait for, in one place.

The "Security" section of docs/operations.md lists these with their values; a test per bound
shows what happens past it. Bounds that a deployment may want to move are config
keys (``max_body_bytes``, ``connections``); these are the fixed ones.
"""

from __future__ import annotations

import re
from itertools import accumulate
from typing import Any

__all__ = [
    "MAX_CHUNK_DEPTH",
    "MAX_EVENT_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_MODEL_CHARS",
    "MAX_YAML_DEPTH",
    "MAX_YAML_NODES",
    "YIELD_EVERY",
    "deeper_than",
]

# One server-sent event (everything up to its blank line) from an upstream. Past it the stream is
# "stream too large": a failover before commit, an error event after. A single answer chunk of
# 10 MB still passes (the fault drill sends one); an event with no end cannot grow memory.
MAX_EVENT_BYTES = 16 * 1024 * 1024

# Decoded bytes a compressed upstream body may hand over before the reader gives the event loop a
# turn. aiohttp inflates a gzip body from bytes already received without waiting for the socket,
# so without this a fast, highly compressed stream never lets the deadline sweeper or /healthz run.
YIELD_EVERY = 1024 * 1024

# A request's JSON nesting. orjson reads 1,024 levels but writes only 254, so a body between the
# two parsed and then failed to go upstream (a 500); real requests (tool schemas included) stay
# far below this.
MAX_JSON_DEPTH = 128
# Brackets in a request body past which its depth is read from the bytes (``json_deeper_than``) rather
# than by walking the parsed value: the walk costs ~2 us a container in Python, so 1.3M empty arrays
# (a 3.9 MB body under the default limit) held the loop 3 s; the bytes take a tenth of that.
WALK_UP_TO = 20_000

# An upstream stream event's JSON nesting. orjson reads 1,024 levels, a client's parser fewer (Python's
# json raised RecursionError near 1,000 less the caller's own stack: the openai SDK in the application);
# a real chunk nests under ten. Deeper ends a committed stream with an error event (usage_taps.py).
# Nesting needs a bracket to open and one to close each level, so an event shorter than twice this
# cannot be this deep: a token-paced stream's every read is exonerated by its length.
MAX_CHUNK_DEPTH = 512

# A client's ``model`` when it is not a route name (a pin names provider/upstream-model): it goes
# into x-route-decision and the access log, so it is bounded in length and character set.
MAX_MODEL_CHARS = 256

# routes.yaml: nesting and the node count after aliases are expanded (an alias bomb is a few
# lines that expand to billions of nodes). A real file has a few hundred nodes.
MAX_YAML_DEPTH = 64
MAX_YAML_NODES = 100_000


def deeper_than(value: Any, limit: int) -> bool:
    """Does ``value`` (parsed JSON) nest containers more than ``limit`` deep? Callers ask only when
    the raw text has that many brackets at all (C-speed counts), so a usual value is never walked."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values() if isinstance(v, dict | list))
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item if isinstance(v, dict | list))
    return False


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, escapes included
_NOT_BRACKETS = bytes(range(256)).translate(None, b"[]{}")
_STEP = tuple(1 if c in b"[{" else -1 if c in b"]}" else 0 for c in range(256))


def json_deeper_than(raw: bytes, limit: int) -> bool:
    """``deeper_than`` read from valid JSON's bytes (a body orjson parsed already): strings removed, the
    brackets left are the structure, and its depth is their running sum. Each step runs in C, so its cost
    follows the body's bytes, not its containers."""
    structure = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, structure)), default=0) > limit
