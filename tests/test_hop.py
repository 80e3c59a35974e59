"""scripts/hop.py: one run of every relay in front of one upstream, as the note's hop figures were read."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "hop.py"


def test_every_relay_answers_and_reads_against_the_direct_call() -> None:
    """Each relay (the pipe without any HTTP, the floor, firstbyte, and nginx, which scripts/test installs
    unless FIRSTBYTE_NO_NGINX says a box has none) relays a streamed answer (hop.py raises on any call that
    is not a 200 with a first chunk), and its row reads its mean over the direct call's."""
    run = subprocess.run([sys.executable, str(SCRIPT), "--rounds", "3", "--repeats", "1", "--first-chunk-ms", "5"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = {m["relay"]: m for m in re.finditer(
        r"^\| (?P<relay>\w+) \| (?P<mean>[\d.]+) \| [\d.]+ \| (?P<added>[+-][\d.]+) \| (?P<x>[\d.]+) \|",
        run.stdout, re.M)}
    expected = {"direct", "firstbyte", "floor", "pipe", *([] if os.environ.get("FIRSTBYTE_NO_NGINX") else ["nginx"])}
    assert set(rows) == expected
    direct = float(rows["direct"]["mean"])
    assert direct >= 5  # the upstream's own first-chunk delay: the calls went through to it
    for row in rows.values():
        assert abs(float(row["x"]) - float(row["mean"]) / direct) < 0.01
