"""scripts/_venv installs only what is missing, so scripts asking for other extras do not undo each other.

The real script is sourced in a scratch root whose ``.venv/bin/python`` only
records the arguments it gets: each recorded line is one ``pip install``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def scratch_root(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "_venv", tmp_path / "scripts" / "_venv")
    (tmp_path / "setup.cfg").write_text("[metadata]\nname = scratch\n")
    (tmp_path / "pyproject.toml").write_text("")
    calls = tmp_path / "calls"
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    python.chmod(0o755)
    return tmp_path, calls


def source(root: Path, extras: str | None) -> None:
    env = {"PATH": "/usr/bin:/bin"} | ({} if extras is None else {"FIRSTBYTE_EXTRAS": extras})
    subprocess.run(["bash", "-c", f"source {root}/scripts/_venv"], env=env, check=True, timeout=30)


def installs(calls: Path) -> list[str]:
    return calls.read_text().splitlines() if calls.exists() else []


def test_scripts_with_different_extras_install_once_each_and_never_reinstall(tmp_path: Path) -> None:
    root, calls = scratch_root(tmp_path)
    source(root, None)  # scripts/test, scripts/bench: dev
    source(root, "dev,bench")  # scripts/simulate-pool
    source(root, None)
    source(root, "dev,bench")
    assert installs(calls) == [f"-m pip install --quiet -e {root}[dev]",
                               f"-m pip install --quiet -e {root}[dev,bench]"]


def test_a_changed_setup_cfg_installs_again_with_what_is_asked(tmp_path: Path) -> None:
    root, calls = scratch_root(tmp_path)
    source(root, "dev,bench")
    (root / "setup.cfg").write_text("[metadata]\nname = scratch\nversion = 2\n")
    source(root, None)
    assert installs(calls) == [f"-m pip install --quiet -e {root}[dev,bench]",
                               f"-m pip install --quiet -e {root}[dev]"]


def test_serve_installs_only_what_serving_needs_and_never_undoes_the_dev_tools(tmp_path: Path) -> None:
    root, calls = scratch_root(tmp_path)
    source(root, "")  # scripts/serve in a fresh clone: the package alone
    source(root, "")
    source(root, None)  # then scripts/test: adds dev
    source(root, "")  # serve again: nothing to do, dev stays
    assert installs(calls) == [f"-m pip install --quiet -e {root}",
                               f"-m pip install --quiet -e {root}[dev]"]
    assert "FIRSTBYTE_EXTRAS=\"\"" in (ROOT / "scripts" / "serve").read_text()


def test_every_install_goes_through_the_constraints_and_a_changed_pin_installs_again(tmp_path: Path) -> None:
    root, calls = scratch_root(tmp_path)
    (root / "constraints.txt").write_text("aiohttp==3.14.5\n")
    source(root, None)
    source(root, None)
    (root / "constraints.txt").write_text("aiohttp==3.14.6\n")
    source(root, None)
    pinned = f"-m pip install --quiet -c {root}/constraints.txt -e {root}[dev]"
    assert installs(calls) == [pinned, pinned]


def test_scripts_serve_and_test_and_the_readme_install_through_the_constraints_file() -> None:
    for script in ("serve", "test", "check"):
        assert 'source "$(dirname "$0")/_venv"' in (ROOT / "scripts" / script).read_text()
    readme = (ROOT / "README.md").read_text()
    assert "pip install -c constraints.txt -e ." in readme
    assert "/opt/firstbyte/.venv/bin/pip install -c constraints.txt ." in readme
    pins = [line for line in (ROOT / "constraints.txt").read_text().splitlines() if "==" in line]
    assert any(line.startswith("aiohttp==") for line in pins)


def test_the_oldest_aiohttp_has_its_own_venv_and_constraints(tmp_path: Path) -> None:
    root, calls = scratch_root(tmp_path)
    (root / "constraints-oldest.txt").write_text("aiohttp==3.10.11\n")
    oldest = root / ".venv-oldest" / "bin" / "python"
    oldest.parent.mkdir(parents=True)
    oldest.write_text(f'#!/bin/sh\necho "oldest $*" >> {calls}\n')
    oldest.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "FIRSTBYTE_VENV": str(root / ".venv-oldest"),
           "FIRSTBYTE_CONSTRAINTS": str(root / "constraints-oldest.txt")}
    subprocess.run(["bash", "-c", f"source {root}/scripts/_venv"], env=env, check=True, timeout=30)
    assert installs(calls) == [f"oldest -m pip install --quiet -c {root}/constraints-oldest.txt -e {root}[dev]"]


def test_the_pinned_aiohttp_is_in_the_range_and_ci_knows_the_tests_that_reach_its_internals() -> None:
    setup = (ROOT / "setup.cfg").read_text()
    low, high = re.search(r"aiohttp>=([\d.]+),<([\d.]+)", setup).groups()  # type: ignore[union-attr]
    pinned = re.search(r"^aiohttp==([\d.]+)$", (ROOT / "constraints.txt").read_text(), re.M).group(1)  # type: ignore[union-attr]

    def version(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in text.split("."))

    assert version(low) <= version(pinned) < version(high)
    facing = (ROOT / "tests" / "aiohttp_facing.txt").read_text().split()
    assert "tests/test_internals.py" in facing and all((ROOT / name).exists() for name in facing)
    assert "tests/aiohttp_facing.txt" in (ROOT / "scripts" / "test").read_text()
