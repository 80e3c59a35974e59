"""The shipped unit file passes ``systemd-analyze verify`` and keeps its promises.

verify also checks that ExecStart is executable, and /opt/firstbyte does not
exist on a test box, so a copy with ExecStart pointing at this venv's
``firstbyte`` is verified instead; everything else is checked as shipped.
Without systemd-analyze the test fails (install it: ``apt-get install -y
systemd``) unless FIRSTBYTE_NO_SYSTEMD=1 says the platform cannot have it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parent.parent / "systemd" / "firstbyte.service"
SHIPPED_EXEC = "/opt/firstbyte/.venv/bin/firstbyte"


def _service_section() -> dict[str, list[str]]:
    """The [Service] keys, repeated keys kept in order (configparser would merge them)."""
    values: dict[str, list[str]] = {}
    section = None
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        if section == "Service":
            key, _, value = line.partition("=")
            values.setdefault(key, []).append(value)
    return values


def test_unit_keeps_the_operational_contract() -> None:
    service = _service_section()
    assert service["Type"] == ["notify"]
    assert service["ExecStart"] == [f"{SHIPPED_EXEC} serve --config /etc/firstbyte/routes.yaml"]
    assert service["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert service["EnvironmentFile"] == ["-/etc/firstbyte/env"]
    assert service["WatchdogSec"] == ["30"]
    assert float(service["TimeoutStopSec"][0]) > 30  # longer than the default shutdown_grace
    assert service["DynamicUser"] == ["yes"]
    assert service["ProtectSystem"] == ["strict"]
    assert service["NoNewPrivileges"] == ["yes"]
    assert service["StateDirectory"] == ["firstbyte"]
    assert int(service["LimitNOFILE"][0]) >= 65536


def _firstbyte_executable() -> str:
    venv_bin = Path(sys.executable).parent
    for candidate in (venv_bin / "firstbyte", Path(sys.executable)):
        if candidate.exists() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise AssertionError("no executable firstbyte or python to point ExecStart at")


def _analyze() -> str:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        if os.environ.get("FIRSTBYTE_NO_SYSTEMD") == "1":
            pytest.skip("systemd-analyze not available and FIRSTBYTE_NO_SYSTEMD=1")
        pytest.fail(
            "systemd-analyze is not installed, so systemd/firstbyte.service cannot be verified: "
            "install it with `apt-get update && apt-get install -y systemd`, "
            "or set FIRSTBYTE_NO_SYSTEMD=1 where the platform cannot have systemd"
        )
    return analyze


def _verify(text: str, directory: Path) -> list[str]:
    """Problems systemd-analyze reports about the unit (it exits 0 on ignored bad lines)."""
    assert text.count(f"ExecStart={SHIPPED_EXEC} ") == 1
    copy = directory / "firstbyte.service"
    copy.write_text(text.replace(f"ExecStart={SHIPPED_EXEC} ", f"ExecStart={_firstbyte_executable()} "))
    result = subprocess.run(
        [_analyze(), "verify", str(copy)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "SYSTEMD_LOG_LEVEL": "notice"},
        check=False,
    )
    output = (result.stdout + result.stderr).strip().splitlines()
    # verify may also report on units it loads alongside; only ours count.
    problems = [line for line in output if "firstbyte" in line]
    if result.returncode != 0:
        problems.append(f"exit status {result.returncode}: {output}")
    return problems


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    assert _verify(UNIT.read_text(), tmp_path) == []


def test_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    broken = UNIT.read_text().replace("ProtectSystem=strict", "ProtectSystem=stricter")
    problems = _verify(broken, tmp_path)
    assert any("ProtectSystem" in p or "protect system" in p for p in problems), problems
