"""The upstream headers a client may see: an allow-list, every value scrubbed.

An upstream's headers are its own business: a debug header may carry the key it
was sent (``X-Debug-Auth: Bearer sk-…``), a cookie is meant for one client of a
shared pool, hop-by-hop headers describe a connection the client never had. A
client needs few of them, so only these pass (docs/adr/0020):

- ``content-type`` (and ``cache-control``, which a stream's ``no-cache`` needs behind caches);
- the provider's rate limits and retry hints, which SDKs and agents act on:
  ``x-ratelimit-*`` (OpenAI, Groq, OpenRouter…), ``anthropic-ratelimit-*``,
  ``retry-after``, ``retry-after-ms``, ``x-should-retry``;
- the provider's request ids, for a support ticket: Anthropic's ``request-id``,
  OpenAI's ``openai-processing-ms`` and ``openai-version``, and its ``x-request-id``
  renamed ``x-upstream-request-id`` (``x-request-id`` is firstbyte's own).

Everything else is dropped, however it is spelled. Hop-by-hop headers are never on
the list. A value that holds a configured secret is scrubbed like an error body.
"""

from __future__ import annotations

from collections.abc import Mapping

from .scrub import Scrubber

__all__ = ["FORWARDED", "FORWARDED_PREFIXES", "forward_headers"]

FORWARDED = frozenset({
    "content-type", "cache-control", "retry-after", "retry-after-ms", "x-should-retry", "request-id",
    "openai-processing-ms", "openai-version",
})
FORWARDED_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-")
_RENAMED = {"x-request-id": "x-upstream-request-id"}
_PLAIN_CONNECTION = frozenset({"close", "keep-alive"})  # names no other header: nothing more to drop
_NO_HOP: frozenset[str] = frozenset()
# Each header name as an upstream spells it -> the name the client gets, None: dropped. Looked up
# once per name, not lowered and matched against the list per header of every answer; bounded, since
# an upstream chooses its names (past the bound a name is judged each time, as before).
VERDICTS: dict[str, str | None] = {}
VERDICTS_MAX = 1024
NAME_MAX = 64  # longer names are judged, never kept: no listed name is half this long, and an upstream's
#                names may be ~8 KB each (the parser's line limit), 1,024 of them ~8 MB of a worker for good
_UNSEEN = "\0unseen"  # the look-up's default: no header name holds a NUL


def _verdict(name: str) -> str | None:
    lower = name.lower()
    verdict = name if lower in FORWARDED or lower.startswith(FORWARDED_PREFIXES) else _RENAMED.get(lower)
    if len(VERDICTS) < VERDICTS_MAX and len(name) <= NAME_MAX:
        VERDICTS[name] = verdict
    return verdict


def forward_headers(upstream: Mapping[str, str], extra: Mapping[str, str],
                    scrubber: Scrubber | None = None) -> dict[str, str]:
    """The upstream's headers a client may see, plus ours (``extra``, which win). A header the
    upstream names in ``Connection`` is hop-by-hop by its own say (RFC 9110 7.6.1): dropped too."""
    headers: dict[str, str] = {}
    named = upstream.get("connection")
    hop = _NO_HOP if named is None or named.lower() in _PLAIN_CONNECTION else frozenset(
        t.strip().lower() for t in named.split(","))
    seen = VERDICTS.get
    for name, value in upstream.items():
        out = seen(name, _UNSEEN)
        if out is _UNSEEN:
            out = _verdict(name)
        if out is not None and (not hop or name.lower() not in hop):
            headers[out] = value
    if scrubber is not None and headers and scrubber.found("\n".join(headers.values())):
        headers = {name: scrubber.text(value) for name, value in headers.items()}
    headers.update(extra)
    return headers
