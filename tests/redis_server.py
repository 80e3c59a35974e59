"""A real ``redis-server`` on a free loopback port, persistence off, for the fleet's tests.

No fake Redis: the fleet is tested against the server it runs against. A missing ``redis-server``
fails the tests that need it, loudly (``scripts/test`` installs Debian's package where it can).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

PASSWORD = "fleet-test-password"  # the tests' own server; never a real secret


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One server; ``kill`` and ``start`` again on the same port (Redis down, then back, empty)."""

    def __init__(self, workdir: Path, password: str | None = PASSWORD) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed: the fleet's tests need a real one "
                        "(apt-get install redis-server, or run scripts/test as root)")
        self.binary = binary
        self.workdir = workdir
        self.password = password
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self.workdir), "--protected-mode", "no", "--loglevel", "warning",
                "--enable-debug-command", "local"]  # DEBUG SLEEP: a stalled Redis, for real
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                assert self.proc.poll() is None, "redis-server exited at start"
                time.sleep(0.02)
        raise AssertionError("redis-server did not listen within 10 s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
