"""The access log: one line per finished exchange, text or JSON, to stderr or a file.

A line carries what an operator greps for (id, client, route, served, status,
timings, tokens, cost) and ends with the full ``x-route-decision`` value, so one
line explains one request. It never carries content or keys: the Finished
record has none, and nothing here reaches for more.

Finished records are buffered in memory and formatted and flushed by a
short-lived task this observer owns, at most every ``FLUSH_SECS``, and on
:meth:`AccessLog.close`: formatting never runs on a request's own path. A flush is
one ``write`` + ``flush`` of the joined lines to the page cache; that is cheap
enough to do on the loop, and batching keeps it to a few syscalls per interval
however busy the proxy is. A buffer that grows past ``MAX_BUFFERED`` lines
(the stream is stuck) drops new lines and counts them rather than growing.

Text format: ``TIME start=START key=value ... decision="..."``. A line is written when its
exchange ends, so ``TIME`` (``time`` in JSON) is the end, and lines are in the order of their
times; ``start`` is when the request arrived (``total`` seconds before the end). Bare values are
``[^\\s"]+``; anything else (a path with a space, the decision) is written as a
JSON string with ASCII escapes, so no client-chosen byte can start a new line
and a reader can parse every field with one regex plus ``json.loads``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import re
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import orjson

from ..config import AccessLog as AccessLogConfig
from . import Finished

__all__ = ["FLUSH_SECS", "MAX_BUFFERED", "AccessLog", "format_json", "format_text"]

log = logging.getLogger(__name__)

FLUSH_SECS = 0.2
MAX_BUFFERED = 50_000

_BARE = re.compile(r"^[\x21-\x7e]+$")


_second: list[Any] = [None, ""]  # the last whole second formatted, and its text


def _iso(epoch: float) -> str:
    second = int(epoch)
    if _second[0] != second:  # most lines of a busy second share the prefix
        _second[0], _second[1] = second, time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(second))
    return f"{_second[1]}{int((epoch - second) * 1000):03d}Z"


def _secs(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _fields(finished: Finished, instance: str | None = None) -> dict[str, Any]:
    """The line's fields in order; None means unknown (``-`` in text, null in JSON)."""
    d = finished.decision
    usage = d.usage if d is not None else {}
    return {
        "time": _iso(finished.started + finished.total),
        "start": _iso(finished.started),
        **({"instance": instance} if instance else {}),  # in a fleet: which instance served
        "id": d.id if d is not None else finished.request_id,
        "client": finished.client,
        "method": finished.method,
        "path": finished.path,
        "status": finished.status,
        "route": d.route if d is not None else finished.asked,
        "served": d.served if d is not None else None,
        "attempts": len(d.attempts) if d is not None else 0,
        "failovers": d.failovers if d is not None else 0,
        "stream": finished.stream,
        "ttfc": _secs(finished.ttfc),
        "total": _secs(finished.total),
        "bytes": finished.bytes_sent,
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "cost_usd": d.cost_usd if d is not None else None,
        "error": finished.error,
        "decision": d.header() if d is not None else None,
    }


def _text_value(value: Any) -> str:
    if value is None:
        return "-"
    if type(value) is int:
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.3f}"
    text = str(value)
    if _BARE.fullmatch(text) and '"' not in text:  # fullmatch: "$" alone lets a trailing newline through
        return text
    return json.dumps(text, ensure_ascii=True)


_quoted: dict[str, str] = {}  # strings seen before and how they are written: most lines repeat them
MAX_QUOTED = 4096


def _text(value: str | None) -> str:
    """:func:`_text_value` for a string, remembered (clients, paths and names recur on every line)."""
    if value is None:
        return "-"
    text = _quoted.get(value)
    if text is None:
        if len(_quoted) >= MAX_QUOTED:
            _quoted.clear()
        text = _quoted[value] = _text_value(value)
    return text


def _num(value: float | None, places: str = ".3f") -> str:
    return "-" if value is None else format(value, places)


def format_text(finished: Finished, instance: str | None = None) -> str:
    """One greppable line: the end time first, then ``key=value`` pairs (``start`` first), the decision last.

    Built in one f-string: this runs for every request, so it avoids the generic
    field loop that :func:`format_json` uses. Anything a client could choose
    (path, client, a pinned model in the route, error text) goes through
    :func:`_text_value`, which quotes it when it is not plain.
    """
    d = finished.decision
    t = _text
    if d is None:  # refused before routing, or not a routed endpoint: the id and route asked for
        rid = _text_value(finished.request_id)
        routed = f"route={_text_value(finished.asked)} served=- attempts=0 failovers=0"
        tokens = "prompt_tokens=- completion_tokens=- cost_usd=-"
        decision = "-"
    else:
        rid = d.id
        routed = f"route={t(d.route)} served={t(d.served)} attempts={len(d.attempts)} failovers={d.failovers}"
        usage = d.usage
        if usage:
            tokens = (f"prompt_tokens={_text_value(usage.get('prompt_tokens'))} "
                      f"completion_tokens={_text_value(usage.get('completion_tokens'))} "
                      f"cost_usd={_num(d.cost_usd, '.6f')}")
        else:
            tokens = f"prompt_tokens=- completion_tokens=- cost_usd={_num(d.cost_usd, '.6f')}"
        header = d.header()
        # Always quoted (it holds spaces and ';'); ASCII in practice, escaped like any other value if not.
        decision = orjson.dumps(header).decode() if header.isascii() else json.dumps(header, ensure_ascii=True)
    error = "" if finished.error is None else f" error={_text_value(finished.error)}"
    served_by = f"instance={instance} " if instance else ""  # in a fleet: which instance served
    return (f"{_iso(finished.started + finished.total)} start={_iso(finished.started)} {served_by}id={rid} "
            f"client={t(finished.client)} method={t(finished.method)} "
            f"path={t(finished.path)} status={finished.status} {routed} "
            f"stream={'true' if finished.stream else 'false'} ttfc={_num(finished.ttfc)} "
            f"total={finished.total:.3f} bytes={finished.bytes_sent} {tokens}{error} decision={decision}")


# Characters JSON allows raw inside a string (orjson escapes only those below 0x20) that
# line-splitting readers (Python's splitlines, JavaScript) take for line ends: a client's path
# must not start a new log line in any of them.
_LINE_BREAKS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


def format_json(finished: Finished, instance: str | None = None) -> str:
    """One JSON object for jq, Vector or Loki; unknown values are null, never absent."""
    line = orjson.dumps(_fields(finished, instance)).decode()
    return line if line.isascii() else line.translate(_LINE_BREAKS)


class AccessLog:
    """Observer writing one line per finished exchange; see the module doc for buffering."""

    def __init__(self, config: AccessLogConfig, stream: TextIO | None = None, instance: str | None = None) -> None:
        self.config = config
        fmt = format_json if config.format == "json" else format_text
        self._format: Callable[[Finished], str] = fmt if not instance else functools.partial(fmt, instance=instance)
        self._owns_stream = stream is None and config.path != "-"
        self._stream: TextIO | None = stream if stream is not None else self._open()
        self._buffer: list[Finished] = []
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.dropped = 0
        self._write_failed = False

    def _open(self) -> TextIO:
        if self.config.path == "-":
            return sys.stderr
        return open(self.config.path, "a", encoding="utf-8")

    def on_finished(self, finished: Finished) -> None:
        if self._closed:
            return
        if len(self._buffer) >= MAX_BUFFERED:
            self.dropped += 1
            return
        self._buffer.append(finished)
        if self._task is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a script or a sync test): write straight away
            self.flush()
            return
        self._task = loop.create_task(self._flush_later(), name="accesslog-flush")

    async def _flush_later(self) -> None:
        try:
            await asyncio.sleep(FLUSH_SECS)
        finally:
            self._task = None
        self.flush()

    def flush(self) -> None:
        """Write out what is buffered; a failing stream is logged once, never raised."""
        if not self._buffer or self._stream is None:
            return
        lines, self._buffer = self._buffer, []
        try:
            text = "\n".join(map(self._format, lines)) + "\n"
        except Exception:  # a formatting bug must not kill the flush task or lose the stream
            log.exception("access log: cannot format %d lines", len(lines))
            self.dropped += len(lines)
            return
        try:
            _write_whole(self._stream, text)
        except (OSError, ValueError) as exc:
            self.dropped += len(lines)
            if not self._write_failed:
                log.warning("access log: cannot write %s: %s", self.config.path, exc)
                self._write_failed = True
        else:
            self._write_failed = False

    def reopen(self) -> None:
        """Reopen the file after logrotate moved it (call on SIGHUP); stderr stays as it is."""
        if not self._owns_stream:
            return
        self.flush()
        old = self._stream
        try:
            self._stream = self._open()
        except OSError as exc:
            log.warning("access log: cannot reopen %s: %s", self.config.path, exc)
            return
        if old is not None:
            with contextlib.suppress(OSError):
                old.close()

    async def close(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.flush()
        if self._owns_stream and self._stream is not None:
            with contextlib.suppress(OSError):
                self._stream.close()
            self._stream = None


PIPE_BUF = 4096  # a write of at most this much to a pipe is never interleaved with another's


def _write_whole(stream: TextIO, text: str) -> None:
    """Write ``text`` (whole lines) so that no line is cut by another process writing to the same
    stream (workers of one box share stderr and the log file): each write is one system call of
    whole lines, at most ``PIPE_BUF`` bytes where lines allow (a file opened for appending takes
    any one write whole)."""
    stream.flush()
    raw = getattr(stream, "buffer", None)
    if raw is None:  # not a real file (a test's StringIO): nobody else writes to it
        stream.write(text)
        stream.flush()
        return
    data = text.encode(stream.encoding or "utf-8", "replace")
    start = 0
    while start < len(data):
        end = len(data) if len(data) - start <= PIPE_BUF else data.rfind(b"\n", start, start + PIPE_BUF) + 1
        if end <= start:  # one line longer than PIPE_BUF: whole, in its own write
            end = data.index(b"\n", start) + 1
        raw.write(data[start:end])
        raw.flush()
        start = end
