"""routes.yaml: every problem at once with its path; secrets from the environment; ``firstbyte check``."""

from __future__ import annotations

import random
import textwrap
from pathlib import Path
from typing import Any

import pytest

from proxy.cli import main
from proxy.config import load_config, parse_config
from proxy.errors import ConfigError
from proxy.routing.plan import Ask, plan
from proxy.state import State


def problems(raw: Any) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(raw, env={})
    return caught.value.problems


def test_every_problem_at_once_with_its_path() -> None:
    raw = {
        "providers": {
            "a": {"kind": "openai"},
            "b": {"kind": "magic"},
            "s": {"kind": "simulated", "simulate": {"fail_rate": 2}},
        },
        "routes": {
            "chat": {
                "strategy": "fastest",
                "deny": ["ghost"],
                "fastest": {"signal": "p99", "alpha": 2},
                "cooldown": {"failures": 0},
                "targets": [
                    {"provider": "a", "model": "m", "weight": -1},
                    {"provider": "grok", "model": "m"},
                    {"model": "x"},
                    {"provider": "s", "model": "m", "price": {"input": 1}, "colour": "red"},
                ],
            },
            "bad/name": {"targets": []},
        },
    }
    assert problems(raw) == [
        "providers.a.base_url: required for kind openai",
        "providers.b.kind: must be one of openai, anthropic, simulated, azure, got 'magic'",
        "providers.s.simulate.fail_rate: must be at most 1, got 2",
        "routes.chat.targets[0].weight: must be at least 0, got -1",
        "routes.chat.targets[1].provider: unknown provider 'grok'",
        "routes.chat.targets[2].provider: required",
        "routes.chat.targets[3].colour: unknown key (expected one of: provider, model, name, retry, weight, "
        "quality, context_window, price)",
        "routes.chat.targets[3].price: needs both input and output (USD per million tokens)",
        "routes.chat.fastest.signal: must be one of ewma, p50, got 'p99'",
        "routes.chat.fastest.alpha: must be at most 1, got 2",
        "routes.chat.cooldown.failures: must be at least 1, got 0",
        "routes.chat.deny: unknown target 'ghost' (targets: a, grok, s)",
        "routes.bad/name: route names may use letters, digits and . _ : @ + - only (no /)",
        "routes.bad/name.targets: required: a non-empty list of targets",
    ]


@pytest.mark.parametrize(
    ("route", "problem"),
    [
        pytest.param({"strategy": "random"}, "routes.chat.strategy: must be one of ordered, weighted, fastest, "
                     "cheapest, score, got 'random'", id="unknown-strategy"),
        pytest.param({"allow": ["nobody"]}, "routes.chat.allow: unknown target 'nobody' (targets: s)",
                     id="allow-unknown-target"),
        pytest.param({"min_quality": 1.5}, "routes.chat.min_quality: must be at most 1, got 1.5", id="quality-floor"),
        pytest.param({"min_context_window": 0}, "routes.chat.min_context_window: must be at least 1, got 0",
                     id="context-floor"),
        pytest.param({"fastest": {"window": 0}}, "routes.chat.fastest.window: must be at least 1, got 0",
                     id="p50-window"),
        pytest.param({"cooldown": {"secs": 301}}, "routes.chat.cooldown.secs: must be at most 300, got 301",
                     id="cooldown-cap"),
    ],
)
def test_route_problems(route: dict[str, Any], problem: str) -> None:
    raw = {"providers": {"s": {"kind": "simulated"}},
           "routes": {"chat": {"targets": [{"provider": "s", "model": "m"}], **route}}}
    assert problems(raw) == [problem]


def test_duplicate_default_names_need_a_name() -> None:
    raw = {"providers": {"s": {"kind": "simulated"}},
           "routes": {"chat": {"targets": [{"provider": "s", "model": "m"}, {"provider": "s", "model": "m"}]}}}
    assert problems(raw) == ["routes.chat.targets[1].name: duplicate target name 's/m' (also targets[0])"]


def test_fastest_defaults_explore_and_smoothing_per_adr_0006() -> None:
    raw = {"providers": {"s": {"kind": "simulated"}},
           "routes": {"chat": {"strategy": "fastest", "targets": [{"provider": "s", "model": "m"}]}}}
    fastest = parse_config(raw, env={}).routes["chat"].fastest
    # DESIGN.md documents explore 0.1 and alpha 0.3; docs/adr/0006 records why these differ.
    assert (fastest.signal, fastest.explore, fastest.alpha) == ("ewma", 0.03, 0.1)


def test_unset_key_env_excludes_its_targets_without_a_crash() -> None:
    raw = {
        "providers": {
            "paid": {"kind": "openai", "base_url": "https://api.example.com/v1", "api_key_env": "PAID_KEY"},
            "free": {"kind": "simulated"},
        },
        "routes": {"chat": {"targets": [{"provider": "paid", "model": "m"}, {"provider": "free", "model": "m"}]}},
    }
    config = parse_config(raw, env={})
    assert not config.providers["paid"].has_credentials
    planned = plan(config, Ask("t1", "chat"), State(), 0.0, random.Random(0))
    assert planned.decision.header() == (
        "id=t1; route=chat; strategy=ordered; order=free(written); excluded=paid(no credentials)"
    )
    keyed = parse_config(raw, env={"PAID_KEY": "sk-1"})
    assert keyed.providers["paid"].api_key == "sk-1"
    assert "sk-1" not in repr(keyed.providers["paid"])


ROUTES = """\
providers:
  fast: {kind: simulated}
  paid: {kind: openai, base_url: https://api.example.com/v1, api_key_env: FB_TEST_UNSET_KEY}
routes:
  chat:
    strategy: cheapest
    min_context_window: 32000
    min_quality: 0.5
    deny: [old]
    targets:
      - {provider: fast, model: small, context_window: 8192, quality: 0.9}
      - {provider: fast, model: big, context_window: 128000, quality: 0.8, price: {input: 1, output: 2}}
      - {provider: fast, model: anon, name: old}
      - {provider: paid, model: gpt, context_window: 128000, quality: 0.9}
      - {provider: fast, model: noq, context_window: 64000}
"""


def test_check_prints_the_plan_with_load_time_floors(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FB_TEST_UNSET_KEY", raising=False)
    path = tmp_path / "routes.yaml"
    path.write_text(ROUTES)
    assert main(["check", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert "route chat  strategy=cheapest" in out
    assert rows["fast/small"].endswith("context window 8192 below min 32000")
    assert rows["fast/big"].endswith("ok")
    assert rows["old"].endswith("deny")
    assert rows["paid"].endswith("no credentials")
    assert rows["fast/noq"].endswith("quality undeclared below min 0.5")


def test_check_refuses_a_bad_file_listing_every_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "routes.yaml"
    path.write_text(textwrap.dedent("""\
        providers:
          a: {kind: simulated}
        routes:
          chat:
            targets:
              - {provider: a, model: m}
              - {provider: grok, model: m}
            fastest: {signal: p99}
    """))
    assert main(["check", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}: 2 problem(s)" in err
    assert "routes.chat.targets[1].provider: unknown provider 'grok'" in err
    assert "routes.chat.fastest.signal: must be one of ewma, p50, got 'p99'" in err


def test_unreadable_and_invalid_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("routes: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
