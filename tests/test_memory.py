"""proxy/memory.py: a large block freed goes back to the system, in a process of its own.

glibc's mallopt is process-wide, so each case runs in a fresh interpreter: one
that held the threshold (as ``firstbyte serve`` does at start) and one that did not.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

# A 10 MB event passes the bounds and is freed; then 32 MB of 2 MB blocks come and go. Without the
# held threshold glibc has raised it to 10 MB at the first free, serves the 2 MB blocks from its heap
# and keeps their pages (measured +12 MB); with it they are mmapped and returned (+0 MB).
PROBE = """
import sys
from proxy.memory import hold_mmap_threshold
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
if sys.argv[1] == "hold":
    assert hold_mmap_threshold()
big = bytearray(10 << 20)
del big
base = rss()
blocks = [bytearray(2 << 20) for _ in range(16)]
del blocks
print(rss() - base)
"""


# 64 blocks of 256 KiB (a body, a joined event), each followed by a 64 KiB block that stays alive, are
# freed. From the heap (glibc's threshold held at 1 MiB, as firstbyte did until the soak kept 10-17 MB),
# the live blocks pin the big ones' pages: measured 0 MB given back. Mmapped (128 KiB held), 16 MB.
PINNED = """
import sys
from proxy import memory
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
if sys.argv[1] == "old":
    memory.MMAP_THRESHOLD = 1 << 20
assert memory.hold_mmap_threshold()
blocks, pins = [], []
for _ in range(64):
    blocks.append(bytearray(256 << 10))
    pins.append(bytearray(64 << 10))
full = rss()
del blocks
print(full - rss())
"""


def probe_mb(mode: str, probe: str = PROBE) -> float:
    out = subprocess.run([sys.executable, "-c", probe, mode], capture_output=True, text=True, check=True)
    return float(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and /proc are Linux's")
def test_large_blocks_freed_after_a_large_event_go_back_to_the_system() -> None:
    assert probe_mb("hold") < 2.0
    assert probe_mb("plain") > 6.0  # the ratchet the held threshold prevents is real on this machine


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and /proc are Linux's")
def test_mid_sized_blocks_between_live_ones_go_back_to_the_system() -> None:
    assert probe_mb("held", PINNED) > 14.0  # given back: 16 MB were freed
    assert probe_mb("old", PINNED) < 4.0  # what a 1 MiB threshold gave back: the soak's growth
