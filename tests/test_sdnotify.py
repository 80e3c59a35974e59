from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.sdnotify import Notifier


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    """A real datagram socket standing in for systemd's notify socket."""
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(2)
    yield path, sock
    sock.close()


def received(sock: socket.socket) -> dict[str, str]:
    fields = sock.recv(4096).decode().split("\n")
    return dict(field.split("=", 1) for field in fields)


def test_lifecycle_messages_reach_the_socket(manager: tuple[str, socket.socket]) -> None:
    path, sock = manager
    notifier = Notifier({"NOTIFY_SOCKET": path})
    try:
        assert notifier.enabled
        assert notifier.ready()
        assert received(sock) == {"READY": "1"}
        before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        assert notifier.reloading()
        reload = received(sock)
        after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        assert reload["RELOADING"] == "1"
        assert before <= int(reload["MONOTONIC_USEC"]) <= after
        notifier.ready()
        assert received(sock) == {"READY": "1"}
        notifier.status("draining\n3 streams left")
        assert received(sock) == {"STATUS": "draining 3 streams left"}
        notifier.stopping()
        assert received(sock) == {"STOPPING": "1"}
        notifier.watchdog()
        assert received(sock) == {"WATCHDOG": "1"}
    finally:
        notifier.close()


def test_abstract_namespace_socket() -> None:
    name = f"firstbyte-test-{os.getpid()}-{time.monotonic_ns()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(2)
    notifier = Notifier({"NOTIFY_SOCKET": "@" + name})
    try:
        assert notifier.ready()
        assert received(sock) == {"READY": "1"}
    finally:
        notifier.close()
        sock.close()


def test_unset_socket_is_a_silent_no_op() -> None:
    notifier = Notifier({})
    assert not notifier.enabled
    assert notifier.ready() is False
    assert notifier.stopping() is False
    assert notifier.watchdog_interval() is None


def test_a_vanished_socket_never_raises(tmp_path: Path) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    assert notifier.ready() is False
    assert notifier.watchdog() is False
    notifier.close()


@pytest.mark.parametrize(
    ("env", "interval"),
    [
        pytest.param({"WATCHDOG_USEC": "30000000"}, 15.0, id="half-of-usec"),
        pytest.param({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 15.0,
                     id="our-pid"),
        pytest.param({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None, id="other-pid"),
        pytest.param({"WATCHDOG_USEC": "0"}, None, id="zero"),
        pytest.param({"WATCHDOG_USEC": "soon"}, None, id="garbage"),
        pytest.param({}, None, id="unset"),
    ],
)
def test_watchdog_interval(env: dict[str, str], interval: float | None) -> None:
    assert Notifier({"NOTIFY_SOCKET": "/run/x", **env}).watchdog_interval() == interval


async def test_run_watchdog_pings_at_half_the_interval(
    manager: tuple[str, socket.socket],
) -> None:
    path, sock = manager
    notifier = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "100000"})  # ping every 50 ms
    task = asyncio.create_task(notifier.run_watchdog())
    await asyncio.sleep(0.18)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    notifier.close()
    sock.setblocking(False)
    pings = []
    while True:
        try:
            pings.append(sock.recv(64))
        except BlockingIOError:
            break
    assert 2 <= len(pings) <= 5  # 4 on an idle box; slack for a loaded CI
    assert set(pings) == {b"WATCHDOG=1"}


async def test_run_watchdog_returns_when_there_is_no_watchdog() -> None:
    await asyncio.wait_for(Notifier({"NOTIFY_SOCKET": "/run/x"}).run_watchdog(), 1)
