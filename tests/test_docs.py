"""The README keeps its promises: what it cites exists, the systemd install steps copy only the
package and create what the unit's Documentation= names, the Codex set-up is the one tested, and
the Responses table names every field that is untranslatable."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import orjson
import pytest
import yaml

from proxy.translate.responses_to_chat import _NEEDS

from .conftest import CONFIG, Proxy

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
APIS = (ROOT / "docs" / "apis.md").read_text()  # the README's long sections live in docs/ (issue 32)
MOVED = ["docs/routing.md", "docs/apis.md", "docs/operations.md", *(f"docs/history/{p.name}" for p in
                                                                   sorted((ROOT / "docs" / "history").glob("*.md")))]


@pytest.mark.parametrize("doc", [pytest.param("README.md", id="readme"), *(pytest.param(p, id=p) for p in MOVED)])
def test_every_file_a_doc_cites_is_in_the_repo(doc: str) -> None:
    text = (ROOT / doc).read_text()
    cited = set(re.findall(r"(?<![\w/.])((?:docs|scripts|tests|proxy|systemd)/[\w./-]+\w)", text))
    assert doc != "README.md" or {"docs/DESIGN.md", *MOVED[:3]} <= cited  # the README points at them
    # an ADR may be cited by its number alone (docs/adr/0004)
    missing = sorted(path for path in cited
                     if not (ROOT / path).exists() and not list(ROOT.glob(f"{path}-*")))
    assert missing == []


def test_the_design_doc_is_in_docs() -> None:
    assert (ROOT / "docs" / "DESIGN.md").read_text().startswith("# firstbyte — design")


def _systemd_install_block() -> str:
    section = README.split("### systemd", 1)[1]
    return section.split("```sh", 1)[1].split("```", 1)[0]


def test_systemd_install_copies_only_the_package() -> None:
    steps = _systemd_install_block()
    assert "cp -r ." not in steps and "/src" not in steps  # not the clone (.venv, .git, tests)
    assert "/opt/firstbyte/.venv/bin/pip install -c constraints.txt ." in steps  # what the suite passed with


def test_the_units_documentation_is_installed_by_the_steps() -> None:
    unit = (ROOT / "systemd" / "firstbyte.service").read_text()
    documentation = re.search(r"^Documentation=file://(\S+)$", unit, re.M)
    assert documentation is not None
    target = documentation.group(1)
    steps = _systemd_install_block()
    installed = re.search(rf"^sudo install -m 644 (\S+) {re.escape(target)}", steps, re.M)
    assert installed is not None, f"no install step creates {target}"
    assert (ROOT / installed.group(1)).exists()


def test_the_readme_codex_setup_is_the_tested_one() -> None:
    toml = APIS.split("~/.codex/config.toml`:", 1)[1].split("```toml", 1)[1].split("```", 1)[0]

    def keys(text: str) -> list[str]:
        return [line.split("#")[0].strip().replace(" ", "") for line in text.splitlines()
                if line.split("#")[0].strip() and "base_url" not in line]

    assert keys(toml)[:3] == ['model="chat"', 'model_provider="firstbyte"', 'web_search="disabled"']
    tested = keys(CONFIG)
    assert [k for k in keys(toml) if not k.startswith("env_key")] == [k for k in tested if not k.startswith("env_key")]


def test_the_responses_table_names_every_untranslatable_field() -> None:
    section = APIS.split("## The Responses API", 1)[1].split("## The simulated model", 1)[0]
    for key in _NEEDS:
        assert f"`{key}`" in section, key


def test_the_readme_is_read_in_ten_minutes() -> None:
    assert len(README.splitlines()) <= 400


def _demo_block() -> str:
    return README.split("Watch `fastest` converge", 1)[1].split("```sh", 1)[1].split("```", 1)[0]


def test_the_convergence_demo_asks_explain_for_the_mode_its_requests_use() -> None:
    demo = _demo_block()
    streamed = '"stream":true' in demo.replace(" ", "")
    explain = next(line for line in demo.splitlines() if "firstbyte explain" in line)
    assert ("--mode buffered" not in explain) if streamed else ("--mode buffered" in explain)


async def test_the_convergence_demo_on_the_shipped_config_rarely_reads_budget_exhausted(
    proxy: Callable[..., Awaitable[Proxy]],
) -> None:
    """The README's twenty requests against the shipped routes.yaml, one after another as curl sends
    them: a `budget exhausted` on most of them (16 of 20 with refresh 0.3 s) looks like a fault.
    The route's generator is seeded (the only change to the shipped file): its random explores (3 %)
    each read `budget exhausted` while the cold start's advances are repaid (some 30 requests), so
    unseeded the count is a draw (CI read 3 once; 14 unseeded runs under load here read 0-3)."""
    raw = yaml.safe_load((ROOT / "routes.yaml").read_text())
    raw["routes"]["chat"]["fastest"]["seed"] = 7
    gateway = await proxy(raw)
    body = orjson.loads(re.search(r"-d '(\{.*\})'", _demo_block()).group(1))  # type: ignore[union-attr]
    refused = 0
    async with aiohttp.ClientSession() as session:
        for _ in range(20):
            async with session.post(gateway.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                await resp.read()
                refused += "budget exhausted" in resp.headers["x-route-decision"]
    assert refused <= 2
