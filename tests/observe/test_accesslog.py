from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest

from proxy.config import AccessLog as AccessLogConfig
from proxy.observe import Finished
from proxy.observe.accesslog import FLUSH_SECS, AccessLog
from proxy.routing.decision import Attempt, Decision, Excluded, Ranked, parse_header

from ..conftest import parse_text

STARTED = 1_700_000_000.25  # 2023-11-14T22:13:20.250Z

DECISION = Decision(
    id="7f3a9c",
    route="chat",
    strategy="fastest",
    order=(Ranked("groq", "fastest", 0.31), Ranked("openai", None, 0.82)),
    excluded=(Excluded("local", "breaker open 12s"), Excluded("premium", "deny")),
    attempts=(
        Attempt("groq", "503", 0.04, failover=True),
        Attempt("openai", "200", 0.79, ttfc=0.79),
    ),
    served="openai",
    status=200,
    usage={"prompt_tokens": 12, "completion_tokens": 34, "total_tokens": 46},
    cost_usd=0.000123,
)


def finished(decision: Decision | None = DECISION, **overrides: object) -> Finished:
    values: dict[str, object] = dict(
        decision=decision,
        started=STARTED,
        client="127.0.0.1",
        method="POST",
        path="/v1/chat/completions",
        status=200,
        operation="chat",
        stream=True,
        ttfc=0.8123,
        total=1.5,
        bytes_sent=2048,
    )
    values.update(overrides)
    return Finished(**values)  # type: ignore[arg-type]


async def test_text_line_carries_every_field_and_the_decision_last(tmp_path: Path) -> None:
    path = tmp_path / "access.log"
    log = AccessLog(AccessLogConfig(format="text", path=str(path)))
    log.on_finished(finished())
    await log.close()

    lines = path.read_text().splitlines()
    assert len(lines) == 1
    time, fields = parse_text(lines[0])
    assert time == "2023-11-14T22:13:21.750Z"  # the end: started + total
    assert list(fields)[-1] == "decision"
    assert fields == {
        "start": "2023-11-14T22:13:20.250Z",
        "id": "7f3a9c",
        "client": "127.0.0.1",
        "method": "POST",
        "path": "/v1/chat/completions",
        "status": "200",
        "route": "chat",
        "served": "openai",
        "attempts": "2",
        "failovers": "1",
        "stream": "true",
        "ttfc": "0.812",
        "total": "1.500",
        "bytes": "2048",
        "prompt_tokens": "12",
        "completion_tokens": "34",
        "cost_usd": "0.000123",
        "decision": DECISION.header(),
    }
    parsed = parse_header(fields["decision"])
    assert parsed.excluded_reason("local") == "breaker open 12s"
    assert parsed.attempt_outcomes() == [("groq", "503"), ("openai", "200")]


async def test_json_line_reads_back_with_json_loads(tmp_path: Path) -> None:
    path = tmp_path / "access.jsonl"
    log = AccessLog(AccessLogConfig(format="json", path=str(path)))
    log.on_finished(finished())
    unserved = Decision(id="b2", route="chat", strategy="ordered", order=())
    log.on_finished(finished(unserved, status=503, ttfc=None))
    await log.close()

    first, second = (json.loads(line) for line in path.read_text().splitlines())
    assert first == {
        "time": "2023-11-14T22:13:21.750Z",
        "start": "2023-11-14T22:13:20.250Z",
        "id": "7f3a9c",
        "client": "127.0.0.1",
        "method": "POST",
        "path": "/v1/chat/completions",
        "status": 200,
        "route": "chat",
        "served": "openai",
        "attempts": 2,
        "failovers": 1,
        "stream": True,
        "ttfc": 0.812,
        "total": 1.5,
        "bytes": 2048,
        "prompt_tokens": 12,
        "completion_tokens": 34,
        "cost_usd": 0.000123,
        "error": None,
        "decision": DECISION.header(),
    }
    assert second["ttfc"] is None
    assert second["served"] is None
    assert second["prompt_tokens"] is None
    assert second["cost_usd"] is None
    assert second["decision"] == "id=b2; route=chat; strategy=ordered; order="


async def test_unknown_values_are_dashes_and_unrouted_requests_still_log() -> None:
    stream = io.StringIO()
    log = AccessLog(AccessLogConfig(format="text"), stream=stream)
    log.on_finished(finished(None, status=401, ttfc=None, operation="", stream=False))
    await log.close()
    _, fields = parse_text(stream.getvalue().rstrip("\n"))
    assert fields["status"] == "401"
    for key in ("id", "route", "served", "ttfc", "prompt_tokens", "cost_usd", "decision"):
        assert fields[key] == "-", key
    assert not stream.closed  # a stream handed in belongs to the caller


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("/v1/chat/completions\nforged=1", id="newline"),
        pytest.param('/v1/a b"c', id="space-and-quote"),
        pytest.param("/v1/\u2028\x85caf\u00e9", id="unicode-line-separators"),
    ],
)
async def test_client_chosen_path_cannot_break_the_line(path: str) -> None:
    stream = io.StringIO()
    log = AccessLog(AccessLogConfig(format="text"), stream=stream)
    log.on_finished(finished(path=path))
    await log.close()
    text = stream.getvalue()
    assert text.isascii()
    assert len(text.splitlines()) == 1
    _, fields = parse_text(text.rstrip("\n"))
    assert fields["path"] == path
    assert "forged" not in fields


async def test_lines_are_buffered_then_flushed_by_the_observers_task() -> None:
    stream = io.StringIO()
    log = AccessLog(AccessLogConfig(format="json"), stream=stream)
    for i in range(3):
        log.on_finished(finished(path=f"/v1/{i}"))
    assert stream.getvalue() == ""  # nothing written on the request path
    await asyncio.sleep(FLUSH_SECS + 0.15)
    assert [json.loads(x)["path"] for x in stream.getvalue().splitlines()] == [
        "/v1/0",
        "/v1/1",
        "/v1/2",
    ]
    log.on_finished(finished(path="/v1/late"))
    await log.close()  # close flushes what the timer has not
    assert json.loads(stream.getvalue().splitlines()[-1])["path"] == "/v1/late"


async def test_reopen_follows_a_rotated_file(tmp_path: Path) -> None:
    path = tmp_path / "access.log"
    log = AccessLog(AccessLogConfig(format="json", path=str(path)))
    log.on_finished(finished(path="/before"))
    log.flush()
    path.rename(tmp_path / "access.log.1")
    log.reopen()
    log.on_finished(finished(path="/after"))
    await log.close()
    assert json.loads((tmp_path / "access.log.1").read_text())["path"] == "/before"
    assert json.loads(path.read_text())["path"] == "/after"


@pytest.mark.parametrize(
    ("fmt", "field", "value"),
    [
        pytest.param("text", "path", "/v1/chat/completions\n", id="text-trailing-newline"),
        pytest.param("text", "error", "upstream said: boom\n", id="text-error-trailing-newline"),
        pytest.param("json", "path", "/v1/\u2028x", id="json-u2028"),
        pytest.param("json", "path", "/v1/\x85x", id="json-u0085"),
        pytest.param("json", "error", "cut \u2029 here", id="json-u2029-in-error"),
    ],
)
async def test_a_client_or_upstream_value_never_starts_a_new_line(fmt: str, field: str, value: str) -> None:
    """``$`` in the bare-value check let a trailing newline through; orjson leaves U+2028, U+2029 and
    U+0085 raw, and Python's splitlines (like JavaScript) ends a line at each."""
    stream = io.StringIO()
    log = AccessLog(AccessLogConfig(format=fmt), stream=stream)
    log.on_finished(finished(**{field: value}))
    await log.close()
    text = stream.getvalue()
    assert len(text.splitlines()) == 1, text
    if fmt == "json":
        assert json.loads(text)[field] == value
    else:
        assert parse_text(text.rstrip("\n"))[1][field] == value


async def test_lines_written_as_exchanges_end_are_in_the_order_of_their_times(tmp_path: Path) -> None:
    """A long exchange that began first ends last: its line comes last, and the time leading each
    line is its end, so the file reads in order (stamped with the start, it did not)."""
    path = tmp_path / "access.log"
    log = AccessLog(AccessLogConfig(format="text", path=str(path)))
    log.on_finished(finished(started=STARTED + 1.0, total=0.5))  # ends at +1.5
    log.on_finished(finished(started=STARTED, total=2.0))  # began first, ends at +2.0
    await log.close()
    parsed = [parse_text(line) for line in path.read_text().splitlines()]
    times = [time for time, _ in parsed]
    assert times == ["2023-11-14T22:13:21.750Z", "2023-11-14T22:13:22.250Z"]
    assert [fields["start"] for _, fields in parsed] == ["2023-11-14T22:13:21.250Z", "2023-11-14T22:13:20.250Z"]
