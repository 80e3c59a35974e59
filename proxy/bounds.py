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
    "MAX_ANSWER_CONTAINERS",
    "MAX_BODY_CONTAINERS",
    "MAX_CHUNK_DEPTH",
    "MAX_EVENT_BYTES",
    "MAX_EVENT_CONTAINERS",
    "MAX_JSON_DEPTH",
    "MAX_MODEL_CHARS",
    "MAX_YAML_DEPTH",
    "MAX_YAML_NODES",
    "WALK_BYTES_PER_BRACKET",
    "YIELD_EVERY",
    "containers_past",
    "deeper_than",
    "json_deeper_than",
    "json_structure",
    "structure_deeper_than",
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
# A request body's depth is read by walking its parsed value (~1.7 us a container in Python) when it has
# fewer brackets than a 500th of its bytes, and from its bytes (``json_structure``: ~3.5 ns a byte in C)
# when it has more: each is taken where it costs less (a 4 MB image with 250 brackets: a 0.4 ms walk, not
# 14 ms of bytes; 40 tools in 6 KB: 0.06 ms of bytes, not a 0.4 ms walk), and neither past ~15 ms.
WALK_BYTES_PER_BRACKET = 500
# JSON objects and arrays in one request body, counted from its bytes before it is parsed: orjson built
# 1.3M empty arrays (a 3.9 MB body under the default max_body_bytes) in 0.5 s, holding the event loop.
# 100,000 take it ~25 ms; a real request (hundreds of messages, a hundred tools' schemas) holds a few thousand.
MAX_BODY_CONTAINERS = 100_000

# An upstream answer's JSON nesting: a stream event's, or a buffered answer's whole body. orjson reads 1,024
# levels, a client's parser fewer (Python's json raised RecursionError near 1,000 less the caller's own stack:
# the openai SDK in the application, at 1,020 levels); a real chunk or answer nests under ten. Deeper is a
# failover before the commit (a buffered answer always is: nothing was sent), and ends a committed stream with
# an error event (usage_taps.py). Nesting needs a bracket to open and one to close each level, so an event
# shorter than twice this cannot be this deep: a token-paced stream's every read is exonerated by its length.
MAX_CHUNK_DEPTH = 512

# JSON objects and arrays in what an upstream answers, counted from the bytes before anything parses them
# (``containers_past``): orjson built 5M empty arrays (15 MB of ``[],``, one event under MAX_EVENT_BYTES) in
# ~0.5 s on the loop, per event. Past the cap is treated as nesting past MAX_CHUNK_DEPTH is: ``invalid body``, a
# failover before the first token, the stream's error event after it. One streamed event (a token's delta with
# its top logprobs) holds a few dozen to a few hundred; 20,000 parse in ~0.5 ms (scripts/answer_hold.py), and
# stay under the collector's first threshold (service.GC_THRESHOLDS), so one event's parse sets off no collection.
# A buffered answer with logprobs holds 170k-700k (about 32 bytes each: a 700k answer is ~22 MB); 1M empty
# arrays parse in ~70 ms. A Responses stream's closing events carry the whole answer: they get the answer's cap.
MAX_EVENT_CONTAINERS = 20_000
MAX_ANSWER_CONTAINERS = 1_000_000

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


# The bytes of JSON that can end a string, or be the structure: everything else is deleted first, so
# what follows runs over a few bytes a value, not over the text. ``{`` and ``}`` become ``[`` and ``]``.
_NOT_STRUCTURE = bytes(c for c in range(256) if c not in b'"[]{}')
_SQUARE = bytes.maketrans(b"{}", b"[]")
_ESCAPE = re.compile(rb"\\.", re.DOTALL)  # one escape: a backslash and the byte it escapes
_STEP = tuple(1 if c == 0x5B else -1 if c == 0x5D else 0 for c in range(256))


def json_structure(raw: bytes) -> bytes:
    """The brackets of valid JSON that are its structure, not text inside its strings, as ``[`` and ``]``.

    Each step is one C pass over bytes: escapes go (a backslash and the byte after it, left to right as a
    parser pairs them: outside strings JSON has no backslash; one regex pass, a quarter of the cost of two
    replaces), so every quote left opens or closes a string; all but quotes and brackets go; adjacent
    quotes go (an empty string, or two strings with nothing between them: either way the brackets inside
    strings stay inside); what is left between quotes is text that looked like brackets. Of invalid JSON,
    every container a parser builds before it fails is counted (the prefix it read is valid), so the
    count can be taken before parsing."""
    if 92 in raw:  # a backslash (an int: memchr)
        raw = _ESCAPE.sub(b"", raw)
    quoted = raw.translate(_SQUARE, _NOT_STRUCTURE).replace(b'""', b"")
    if quoted.find(b'"') < 0:
        return quoted
    return b"".join(quoted.split(b'"')[::2])


def structure_deeper_than(structure: bytes, limit: int) -> bool:
    """Does ``structure`` (``json_structure``'s brackets) nest past ``limit``? Removing every innermost
    ``[]`` (a C ``replace``) takes one level off every branch, so a bushy answer (a logprobs list of
    thousands of small objects) is gone in a few passes; passes go on while they shrink it by a tenth,
    then the running sum of what is left says the rest (in C, about 50 ns a bracket)."""
    if structure.count(b"[") <= limit:
        return False
    passes = 0
    while structure and passes <= limit:
        shorter = structure.replace(b"[]", b"")
        if len(shorter) * 10 > len(structure) * 9:
            break
        structure, passes = shorter, passes + 1
    if not structure or passes > limit:
        return passes > limit
    return passes + max(accumulate(map(_STEP.__getitem__, structure))) > limit


def containers_past(raw: bytes, limit: int) -> int:
    """How many objects and arrays ``raw`` (JSON, or what a parser would read of it) holds when that is more
    than ``limit``; 0 when it is not. A container takes two bytes (``[]``; a cut text's, one: still at most
    twice the cap), so a text of at most twice ``limit`` bytes is cleared by its length (a streamed event's
    every read pays one comparison); a longer one by two C counts of its brackets (text's included, so at
    least the containers); only one with more brackets than ``limit`` is read through ``json_structure``
    (C passes, 1-3 ns a byte: 15 MB of ``[],`` in ~15 ms, where orjson took ~0.5 s to build its 5M)."""
    if len(raw) <= 2 * limit or raw.count(b"[") + raw.count(b"{") <= limit:
        return 0
    containers = json_structure(raw).count(b"[")
    return containers if containers > limit else 0


def json_deeper_than(raw: bytes, limit: int) -> bool:
    """``deeper_than`` read from valid JSON's bytes: its cost follows the bytes, not the containers
    (the walk costs ~2 us a container in Python; this, a 0.8 MB logprobs answer in a few ms)."""
    return structure_deeper_than(json_structure(raw), limit)
