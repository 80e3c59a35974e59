"""Secrets scrubbed from upstream text before firstbyte relays or logs it.

An upstream may echo the key it was sent (a 401 quoting the bad key, a debug
500 dumping its request). The scrubber knows every provider key and client key
of each config it was given, old ones included after a reload (a rotated-out
key is still a secret), and replaces each with ``[redacted]``. It runs on
upstream error bodies (in the transport, before any truncation could cut a key
in half) and on failure text (error events, the access log's ``error``), never
on the chunks of a 2xx answer: that would cost every streamed call a scan.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

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

    def text(self, value: str) -> str:
        return value if self._text is None else self._text.sub(REDACTED, value)

    def bytes(self, value: bytes) -> bytes:
        return value if self._bytes is None else self._bytes.sub(REDACTED.encode(), value)
