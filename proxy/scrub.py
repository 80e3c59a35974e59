"""Secrets scrubbed from upstream text before firstbyte relays or logs it.

An upstream may echo the key it was sent (a 401 quoting the bad key, a debug
500 dumping its request). The scrubber knows every provider key and client key
of each config it was given, old ones included after a reload (a rotated-out
key is still a secret), and replaces each with ``[redacted]``.

Everything an upstream says that is not its answer passes it, whole, before any of
it is read or cut short, at the one place each kind of text enters:

- before the commit, ``Walker._settle``: every attempt's end is judged there, so an
  error body (any status), an error object inside a 200 and an error event before
  the first token (each dialect, buffered or streamed, hedged or not) are scrubbed
  before they are classified, normalised or quoted (``first_token.scrubbed``);
- after the commit, the relay's ``_fail``: the failure text and the events that
  went with it;
- ``/v1/messages/count_tokens``, which is not routed, scrubs the answer it relays;
- headers: ``egress.forward_headers`` passes only an allow-list, values scrubbed.

The content of a 2xx answer (its chunks, a buffered answer) is the model's words
and is never scanned: that would cost every call a search.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable

import orjson

__all__ = ["MIN_SECRET_CHARS", "REDACTED", "Scrubber"]

REDACTED = "[redacted]"
# Shorter values would match ordinary words; a key this short is not a secret worth the name.
MIN_SECRET_CHARS = 8


class Scrubber:
    """Replace known secrets in text and bytes; one compiled alternation, longest first."""

    __slots__ = ("_bytes", "_secrets", "_text")

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: frozenset[str] = frozenset()
        self._text: re.Pattern[str] | None = None
        self._bytes: re.Pattern[bytes] | None = None
        self.add(secrets)

    def add(self, secrets: Iterable[str]) -> None:
        """Learn more secrets (a reload's keys); the ones already known stay."""
        new = self._secrets | {s for s in secrets if len(s) >= MIN_SECRET_CHARS}
        if new == self._secrets:
            return
        self._secrets = new
        ordered = sorted(new, key=len, reverse=True)
        self._text = re.compile("|".join(map(re.escape, ordered)))
        self._bytes = re.compile(b"|".join(re.escape(s.encode("utf-8", "surrogateescape")) for s in ordered))

    def found(self, value: str) -> bool:
        """Does ``value`` hold a secret? One search, for text that seldom does (header values)."""
        return self._text is not None and self._text.search(value) is not None

    def error_body(self, body: bytes) -> bytes:
        """An upstream's error text with every secret out, however its JSON spells them: a JSON
        body is read and written again first (orjson writes no ``\\u`` escape for ASCII), so an
        escaped key cannot slip past the search and come back unescaped in a normalised error."""
        if self._bytes is None or not body:
            return body
        with contextlib.suppress(orjson.JSONDecodeError, TypeError):  # not JSON: searched as it is
            body = orjson.dumps(orjson.loads(body))
        return self.bytes(body)

    def text(self, value: str) -> str:
        return value if self._text is None else self._text.sub(REDACTED, value)

    def bytes(self, value: bytes) -> bytes:
        return value if self._bytes is None else self._bytes.sub(REDACTED.encode(), value)
