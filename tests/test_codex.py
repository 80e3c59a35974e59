"""OpenAI's Codex CLI (``codex exec``) through firstbyte to the simulated pool, over loopback.

Codex speaks only the Responses API to a custom provider (``wire_api = "responses"``,
streamed). The CLI is an npm package: ``scripts/codex-cli`` installs a pinned version into
``.tools/codex`` (scripts/test runs it first); this test runs the same script, and is skipped
only when that install fails (no npm, no registry), with the script's reason.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from .conftest import CONFIG, Recorder, route_config

ROOT = Path(__file__).resolve().parent.parent
SIM = {"kind": "simulated", "simulate": {"first_chunk_ms": 2, "jitter_ms": 0, "chunk_ms": 0, "chunks": 6}}


@pytest.fixture(scope="module")
def codex() -> str:
    found = os.environ.get("CODEX_BIN")
    if found:
        return found
    run = subprocess.run(["bash", str(ROOT / "scripts" / "codex-cli")], capture_output=True, text=True,
                         timeout=300, check=False)
    if run.returncode != 0:
        pytest.skip(f"the Codex CLI cannot be installed here: {run.stderr.strip()}")
    return run.stdout.strip().splitlines()[-1]


async def run_codex(codex: str, url: str, home: Path, prompt: str) -> tuple[int, str, str]:
    (home / "codex").mkdir()
    (home / "codex" / "config.toml").write_text(CONFIG.format(url=url))
    work = home / "work"
    work.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "CODEX_HOME": str(home / "codex"),
           "FIRSTBYTE_KEY": "unused", "NO_COLOR": "1"}
    proc = await asyncio.create_subprocess_exec(
        codex, "exec", "--skip-git-repo-check", "--color", "never", prompt, cwd=work, env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=50)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_codex_exec_answers_from_the_simulated_pool(codex, proxy, tmp_path):
    recorder = Recorder()
    p = await proxy(route_config([{"provider": "sim-a", "model": "sim-1"}, {"provider": "sim-b", "model": "sim-1"}],
                                 {"sim-a": SIM, "sim-b": SIM}, strategy="fastest"), observers=[recorder])
    code, out, err = await run_codex(codex, p.url, tmp_path, "say hi")
    assert code == 0, err[-2000:]
    assert out.strip() == "tok0 tok1 tok2 tok3 tok4 tok5", err[-2000:]
    await p.stop()
    asked = [f for f in recorder.seen if f.path == "/v1/responses"]
    assert asked and all(f.status == 200 and f.stream for f in asked)
    assert asked[0].decision is not None and asked[0].decision.served in ("sim-a", "sim-b")


async def test_codex_runs_a_tool_the_model_calls_and_gets_an_answer_after_it(codex, proxy, tmp_path):
    recorder = Recorder()
    p = await proxy(route_config([{"provider": "sim", "model": "sim-1"}], {"sim": SIM}), observers=[recorder])
    code, out, err = await run_codex(codex, p.url, tmp_path, "please use exec_command")
    assert code == 0, err[-2000:]
    # The simulator called exec_command (arguments from Codex's own schema); Codex ran it and
    # sent its output back as a function_call_output; the simulator answered after the result.
    assert out.strip().startswith("The tool returned:"), out + err[-2000:]
    await p.stop()
    assert len([f for f in recorder.seen if f.path == "/v1/responses" and f.status == 200]) == 2
