"""The README keeps its promises: what it cites exists, the systemd install steps copy only the
package and create what the unit's Documentation= names, the Codex set-up is the one tested, and
the Responses table names every field that is untranslatable."""

from __future__ import annotations

import re
from pathlib import Path

from proxy.translate.responses_to_chat import _NEEDS

from .test_codex import CONFIG

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_every_file_the_readme_cites_is_in_the_repo() -> None:
    cited = set(re.findall(r"(?<![\w/.])((?:docs|scripts|tests|proxy|systemd)/[\w./-]+\w)", README))
    assert "docs/DESIGN.md" in cited
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
    assert "/opt/firstbyte/.venv/bin/pip install ." in steps


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
    toml = README.split("~/.codex/config.toml`:", 1)[1].split("```toml", 1)[1].split("```", 1)[0]

    def keys(text: str) -> list[str]:
        return [line.split("#")[0].strip().replace(" ", "") for line in text.splitlines()
                if line.split("#")[0].strip() and "base_url" not in line]

    assert keys(toml)[:3] == ['model="chat"', 'model_provider="firstbyte"', 'web_search="disabled"']
    tested = keys(CONFIG)
    assert [k for k in keys(toml) if not k.startswith("env_key")] == [k for k in tested if not k.startswith("env_key")]


def test_the_responses_table_names_every_untranslatable_field() -> None:
    section = README.split("### The Responses API", 1)[1].split("### The simulated model", 1)[0]
    for key in _NEEDS:
        assert f"`{key}`" in section, key
