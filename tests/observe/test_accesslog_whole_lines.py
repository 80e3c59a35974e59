"""The access log's writes: whole lines, each write small enough that a pipe never interleaves it
with another worker's (PIPE_BUF), so the box's one stream has no line cut by another's."""

from __future__ import annotations

import io

import pytest

from proxy.observe.accesslog import PIPE_BUF, _write_whole


class Recording(io.RawIOBase):
    """What the system would be asked to write, one entry per write call."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[no-untyped-def,override]
        self.writes.append(bytes(b))
        return len(b)


@pytest.mark.parametrize("lines", [
    pytest.param(["short line"], id="one-line"),
    pytest.param([f"id={i:06d} route=chat served=up status=200 " + "x" * 180 for i in range(300)],
                 id="a-batch-of-60kb"),
    pytest.param(["a" * 100, "b" * 9000, "c" * 100], id="a-line-longer-than-pipe-buf-stays-whole"),
    pytest.param([f"émoji ✓ {i} " + "é" * 300 for i in range(40)], id="multibyte"),
])
def test_every_write_is_whole_lines_within_pipe_buf_where_lines_allow(lines: list[str]) -> None:
    raw = Recording()
    stream = io.TextIOWrapper(io.BufferedWriter(raw, buffer_size=65536), encoding="utf-8")
    text = "\n".join(lines) + "\n"
    _write_whole(stream, text)
    assert b"".join(raw.writes) == text.encode()
    for chunk in raw.writes:
        assert chunk.endswith(b"\n")
        assert len(chunk) <= PIPE_BUF or chunk.count(b"\n") == 1  # only a line that long goes alone
