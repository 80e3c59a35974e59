"""The one rule for failing over: every failure of an attempt becomes an Outcome here.

DESIGN.md "Walking the order": transport failures, timeouts, 408, 429, 5xx, the
provider's context overflow, a provider's 401/403 (its key, amendment 2026-12-05), the
route's ``fail_over_on`` statuses and a full concurrency queue are failover-safe;
any other 4xx goes back to the client as it is; a 2xx commits. ``busy`` moves on
but says nothing about the provider (the limit is ours), so it never feeds the breaker.
Foreign failures (aiohttp, ssl, OS errors) arrive already named by the transport edge
(``transport.failure_of``), so nothing here knows the HTTP client.
"""

from __future__ import annotations

import datetime
import email.utils
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

import orjson

from ..bounds import MAX_ANSWER_CONTAINERS, MAX_CHUNK_DEPTH, json_structure, structure_deeper_than
from ..errors import StreamTooLarge
from ..state.breaker import MAX_COOLDOWN
from ..translate.first_token import Ended, UpstreamError
from ..upstream.transport import BodyTooLarge, failure_of
from .limiter import Busy


@dataclass(frozen=True, slots=True)
class Outcome:
    word: str  # what the decision header shows: "503", "reset", "timeout", "busy"…
    failover: bool  # safe to try elsewhere, and counted against the target
    status: int  # what the client gets if this is the last word: the upstream's, 502 or 504
    message: str
    retry_after: float | None = None
    counts: bool = True  # counted against the target's health; not when the limit is our own


BUSY = Outcome("busy", True, 503, "provider concurrency limit and queue are full", counts=False)
# A buffered 2xx whose body is not a JSON object (an HTML page, a cut body): the upstream failed,
# so it fails over and counts, and the breaker hears a failure, not the success its status claims.
INVALID_BODY = Outcome("invalid body", True, 502, "upstream answered 2xx with a body that is not its answer "
                       "(not a JSON object, or fields of the wrong types)")


_OBJECT_START = re.compile(rb"\s*\{")
FULL_JSON_CHECK = 1024 * 1024  # bodies up to this are parsed (a few microseconds per KB); larger ones framed only


def is_json_object(body: bytes) -> bool:
    """A buffered answer that can be relayed: a JSON object (every API firstbyte speaks answers one).

    A body up to ``FULL_JSON_CHECK`` is parsed; a larger one is only checked to start
    with ``{`` and end with ``}``, which catches HTML pages and cut bodies without
    parsing megabytes on the loop."""
    if len(body) <= FULL_JSON_CHECK:
        try:
            return isinstance(orjson.loads(body), dict)
        except orjson.JSONDecodeError:
            return False
    return _OBJECT_START.match(body) is not None and body[-64:].rstrip().endswith(b"}")


# A buffered 2xx nested past what a client's parser reads (MAX_CHUNK_DEPTH, as a stream's event): the openai
# SDK raised RecursionError at 1,020 levels, which orjson reads (1,024). Not the answer: a failover, counted.
TOO_DEEP_BODY = Outcome("invalid body", True, 502, f"upstream answered 2xx with JSON nested more than "
                        f"{MAX_CHUNK_DEPTH} levels deep, past what a client's parser reads; a real answer nests "
                        "under ten: report it to the provider")


def too_many_containers(count: int) -> Outcome:
    """A buffered 2xx with more objects and arrays than ``MAX_ANSWER_CONTAINERS``: refused before anything
    parses it (orjson held the loop ~0.5 s building 5M), and, like an answer nested too deep, a failover."""
    return Outcome("invalid body", True, 502, f"upstream answered 2xx with {count:,} JSON objects and arrays, "
                   f"more than the {MAX_ANSWER_CONTAINERS:,} firstbyte reads in one answer (one with logprobs "
                   "holds under 700,000): report it to the provider")


def outsized(body: bytes) -> Outcome | None:
    """Is a buffered answer nested past ``MAX_CHUNK_DEPTH`` or made of more than ``MAX_ANSWER_CONTAINERS``
    objects and arrays? Shorter than two bytes a level, or with fewer brackets than levels (two C counts),
    it is neither (the cap is above the depth); else one ``json_structure`` says both (a 0.8 MB logprobs
    answer costs a few ms, where walking its parsed containers cost 85), whatever its size, so a body past
    ``FULL_JSON_CHECK`` is read too."""
    if len(body) <= 2 * MAX_CHUNK_DEPTH or body.count(b"[") + body.count(b"{") <= MAX_CHUNK_DEPTH:
        return None
    structure = json_structure(body)
    count = structure.count(b"[")
    if count > MAX_ANSWER_CONTAINERS:
        return too_many_containers(count)
    return TOO_DEEP_BODY if structure_deeper_than(structure, MAX_CHUNK_DEPTH) else None


def fails_over(status: int) -> bool:
    return status in (401, 403, 408, 429) or status >= 500


# A provider's 401/403 answers firstbyte's key for it (the client's never goes upstream): an
# outage of that target for everyone, so it moves on and counts, and a client that gets it last
# gets a 502 saying whose key to fix, not a 401 that reads as its own.
AUTH_FAILED = "the provider refused firstbyte's key for it; check the provider's api_key_env or api_key_file"


MAX_HINT = MAX_COOLDOWN  # one answer cools a target down for at most the breaker's longest cooldown


def retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), if any, at most
    ``MAX_HINT``. Only digits count as seconds (``float`` would take ``inf``, ``1e999`` or
    ``1_000``); anything else that is no HTTP date is ignored."""
    value = headers.get("retry-after")
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return min(float(value), MAX_HINT)
    try:
        moment = email.utils.parsedate_to_datetime(value)
        if moment.tzinfo is None:  # asctime and a -0000 zone: GMT (RFC 9110 5.6.7), not local time
            moment = moment.replace(tzinfo=datetime.UTC)
        when = moment.timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return min(max(0.0, when - (time.time() if now is None else now)), MAX_HINT)


def classify_status(status: int, headers: Mapping[str, str], overflow: bool,
                    also: tuple[int, ...] = ()) -> Outcome:
    """``also``: the route's ``fail_over_on``, statuses it moves on from too (a 404 from a
    provider that lacks a model, say)."""
    if overflow:
        return Outcome("400 context overflow", True, 400, "context length exceeded upstream")
    if status in (401, 403):
        return Outcome(str(status), True, 502, f"upstream answered {status}: {AUTH_FAILED}")
    if fails_over(status) or status in also:
        hint = retry_after(headers) if status in (429, 503, 529) else None
        return Outcome(str(status), True, status, f"upstream answered {status}", hint)
    return Outcome(str(status), False, status, f"upstream answered {status}")


def classify_exception(exc: BaseException) -> Outcome:
    """Map a failure before commit to an outcome; unknown exceptions propagate."""
    if isinstance(exc, Busy):  # with words: no place of a fleet's limit here (walk/limiter.py)
        return BUSY if not exc.args else Outcome("busy", True, 503, str(exc.args[0]), counts=False)
    if isinstance(exc, BodyTooLarge | StreamTooLarge):
        return Outcome("oversized", True, 502, str(exc))
    failure = failure_of(exc)
    if failure is None:
        raise exc
    word, message = failure
    return Outcome(word, True, 504 if word == "timeout" else 502, message)


# An error inside a 2xx (docs/adr/0007) is classified like its HTTP twin: the status the
# upstream would have answered had it said so in its status line.
_TWINS = {
    "rate_limit_error": 429, "rate_limit_exceeded": 429, "rate_limited": 429, "too_many_requests": 429,
    "insufficient_quota": 429, "overloaded_error": 529, "overloaded": 503, "server_overloaded": 503,
    "service_unavailable": 503, "unavailable": 503, "api_error": 500, "server_error": 500,
    "internal_error": 500, "internal_server_error": 500, "upstream_error": 502, "bad_gateway": 502,
    "timeout": 504, "timeout_error": 504, "request_timeout": 408, "invalid_request_error": 400,
    "invalid_request": 400, "bad_request": 400, "badrequesterror": 400, "context_length_exceeded": 400,
    "authentication_error": 401, "invalid_api_key": 401, "permission_error": 403,
    "permission_denied": 403, "not_found_error": 404, "model_not_found": 404, "not_found": 404,
    "request_too_large": 413,
}
_WORD_UNSAFE = re.compile(r"[^a-z0-9_.-]")


def classify_error(error: UpstreamError, where: str, overflow: bool) -> Outcome:
    """An error event before the first token (``where="event"``) or a buffered 2xx carrying an
    error object (``where="body"``). Overload, server and rate-limit errors fail over and count
    like a 503/529/429; an invalid request goes back to the client as a 400 would. A kind we do
    not know is a server error: the client has seen nothing, so another target may answer."""
    kind = _WORD_UNSAFE.sub("_", error.kind.lower())[:40] or "unknown"
    status = error.status if error.status is not None and 400 <= error.status <= 599 else _TWINS.get(kind, 502)
    word = f"error {where} {kind}"
    message = f"upstream answered 200 with an error {where} ({kind}): {error.message[:300]}"
    if overflow:
        return Outcome(word, True, 400, message)
    return Outcome(word, fails_over(status), status, message)


def classify_ended(ended: Ended) -> Outcome:
    """A stream that ended, or broke, before its first token: the upstream's failure."""
    sample = f": {ended.sample[:80]!r}" if ended.sample else ""
    return Outcome(ended.why, True, 502, f"upstream stream failed before its first token: {ended.detail}{sample}")
