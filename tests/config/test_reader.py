"""routes.yaml: every problem at once with its path; secrets from the environment; ``firstbyte check``."""

from __future__ import annotations

import random
import textwrap
from pathlib import Path
from typing import Any

import pytest

from proxy.cli import main
from proxy.config import Hedge, load_config, parse_config, read_yaml
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
        pytest.param({"fastest": {"load_fit": "on"}}, "routes.chat.fastest.load_fit: expected true or false, "
                     "got 'on'", id="load-fit-is-a-flag"),
        pytest.param({"fail_over_on": [404, 200]}, "routes.chat.fail_over_on[1]: expected an HTTP error status, "
                     "400 to 599, got 200", id="fail-over-on-a-success"),
        pytest.param({"fail_over_on": ["404"]}, "routes.chat.fail_over_on[0]: expected an HTTP error status, "
                     "400 to 599, got '404'", id="fail-over-on-a-string"),
        pytest.param({"fail_over_on": 404}, "routes.chat.fail_over_on: expected a list of HTTP statuses "
                     "(400 to 599), got 404", id="fail-over-on-not-a-list"),
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


@pytest.mark.parametrize(
    ("route", "load_fit", "refresh"),
    [
        pytest.param({"hedge": False}, False, None, id="without-hedge-no-load-fit-as-before"),
        pytest.param({}, True, 0.3, id="fastest-races-by-default-so-the-load-fit-is-on"),
        pytest.param({"hedge": {}}, True, 0.3, id="under-a-race-the-load-fit-is-on-and-refresh-0.3"),
        pytest.param({"hedge": {}, "fastest": {"load_fit": False}}, False, 0.3, id="off-when-told"),
        pytest.param({"hedge": False, "fastest": {"load_fit": True}}, True, None, id="on-when-told-without-hedge"),
    ],
)
def test_load_fit_and_refresh_defaults_per_adr_0008(route: dict[str, Any], load_fit: bool,
                                                     refresh: float | None) -> None:
    raw = {"providers": {"s": {"kind": "simulated"}},
           "routes": {"chat": {"strategy": "fastest", "targets": [{"provider": "s", "model": "m"}], **route}}}
    parsed = parse_config(raw, env={}).routes["chat"]
    assert parsed.fastest.load_fit is load_fit
    assert (None if parsed.hedge is None else parsed.hedge.refresh_secs) == refresh


@pytest.mark.parametrize(
    ("route", "hedge"),
    [
        pytest.param({"strategy": "fastest"}, Hedge(), id="fastest-saying-nothing-races-with-the-defaults"),
        pytest.param({"strategy": "fastest", "hedge": False}, None, id="fastest-hedge-false-does-not-race"),
        pytest.param({"strategy": "fastest", "hedge": None}, Hedge(), id="fastest-bare-hedge-races-with-the-defaults"),
        pytest.param({"strategy": "ordered", "hedge": None}, Hedge(), id="ordered-bare-hedge-races-as-hedge-{}"),
        pytest.param({"strategy": "fastest", "hedge": True}, Hedge(), id="hedge-true-is-the-defaults"),
        pytest.param({"strategy": "fastest", "hedge": {"max_extra": 0.05}}, Hedge(max_extra=0.05), id="told"),
        pytest.param({}, None, id="ordered-races-only-when-told"),
        pytest.param({"strategy": "weighted"}, None, id="weighted-races-only-when-told"),
        pytest.param({"strategy": "ordered", "hedge": True}, Hedge(), id="ordered-told-races"),
    ],
)
def test_a_fastest_route_races_unless_told_not_to(route: dict[str, Any], hedge: Hedge | None) -> None:
    raw = {"providers": {"s": {"kind": "simulated"}},
           "routes": {"chat": {"targets": [{"provider": "s", "model": "m"}], **route}}}
    assert parse_config(raw, env={}).routes["chat"].hedge == hedge


@pytest.mark.parametrize("strategy", ["fastest", "ordered"])
def test_a_bare_hedge_in_yaml_races_like_an_empty_one(strategy: str) -> None:
    """``hedge:`` with nothing after it (its keys commented out, say) is YAML null: it names racing,
    so it races with the defaults, as a bare ``cooldown:`` takes the cooldown's defaults."""
    text = (f"providers: {{s: {{kind: simulated}}}}\nroutes:\n  chat:\n    strategy: {strategy}\n"
            "    hedge:\n    #  after: p75\n    targets: [{provider: s, model: m}]\n")
    route = parse_config(read_yaml(text, "routes.yaml"), env={}).routes["chat"]
    assert route.hedge == Hedge() and route.fastest.load_fit is True


@pytest.mark.parametrize(
    ("yaml_line", "read"),
    [
        pytest.param("hedge: {max_extra: }", lambda c: c.routes["chat"].hedge, id="hedge-max-extra"),
        pytest.param("hedge: {refresh: null, cap: ~}", lambda c: c.routes["chat"].hedge, id="hedge-refresh-cap"),
        pytest.param("cooldown: {failures: , secs: }", lambda c: c.routes["chat"].cooldown, id="cooldown"),
        pytest.param("fastest: {alpha: , max_age_secs: , explore: }", lambda c: c.routes["chat"].fastest,
                     id="fastest"),
        pytest.param("strategy:", lambda c: c.routes["chat"].strategy, id="strategy"),
    ],
)
def test_a_bare_key_takes_its_default_as_a_bare_section_does(yaml_line: str, read: Any) -> None:
    """``max_extra:`` with its value commented out is YAML null, as a bare ``hedge:`` is: the default,
    not None (which passed the reader and then failed every request with a 500 TypeError)."""
    route = "    strategy: fastest\n" if not yaml_line.startswith("strategy") else ""
    bare = (f"providers: {{s: {{kind: simulated}}}}\nroutes:\n  chat:\n{route}    {yaml_line}\n"
            "    targets: [{provider: s, model: m}]\n")
    unset = bare.replace(f"    {yaml_line}\n", "")
    assert read(parse_config(read_yaml(bare, "routes.yaml"), env={})) == read(
        parse_config(read_yaml(unset, "routes.yaml"), env={}))


def test_bare_timeouts_and_target_keys_take_their_defaults() -> None:
    text = ("providers: {s: {kind: simulated, timeouts: {connect: , first_chunk: , idle: , total: }}}\n"
            "routes: {chat: {targets: [{provider: s, model: m, retry: , weight: }]}}\n")
    config = parse_config(read_yaml(text, "routes.yaml"), env={})
    target = config.routes["chat"].targets[0]
    assert (target.retry, target.weight) == (0, 1.0)
    assert config.providers["s"].timeouts == parse_config(
        read_yaml("providers: {s: {kind: simulated}}\nroutes: {chat: {targets: [{provider: s, model: m}]}}\n",
                  "routes.yaml"), env={}).providers["s"].timeouts


def test_check_prints_a_bare_max_extra_as_the_default(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "routes.yaml"
    path.write_text("providers: {s: {kind: simulated}}\nroutes:\n  chat:\n    strategy: fastest\n"
                    "    hedge: {max_extra: }\n    targets: [{provider: s, model: m}]\n")
    assert main(["check", "--config", str(path)]) == 0
    assert "races: after p90, max_extra 0.1," in capsys.readouterr().out


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


BASE = textwrap.dedent("""\
    providers:
      s: {kind: simulated}
    routes:
      chat: {targets: [{provider: s, model: m}]}
    """)


def refused(tmp_path: Path, text: str | bytes) -> list[str]:
    path = tmp_path / "routes.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    return caught.value.problems


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        pytest.param(BASE + "providers:\n  t: {kind: simulated}\n", "providers: duplicate key (lines 1 and 5)",
                     id="top-level"),
        pytest.param(BASE.replace("{kind: simulated}", "{kind: simulated, kind: openai}"),
                     "providers.s.kind: duplicate key (lines 2 and 2)", id="nested-flow"),
        pytest.param(BASE.replace("model: m}", "model: m, model: n}"),
                     "routes.chat.targets[0].model: duplicate key (lines 4 and 4)", id="in-a-list"),
    ],
)
def test_duplicate_keys_are_refused_with_their_path(tmp_path: Path, text: str, problem: str) -> None:
    """YAML lets the last duplicate win silently: a second providers: block hid the first."""
    assert problem in refused(tmp_path, text)


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("http://exa mple.com/v1", id="space"),
        pytest.param("http://host:99999/v1", id="port-out-of-range"),
        pytest.param("https://[::1/v1", id="bad-ipv6"),
        pytest.param("http:///v1", id="no-host"),
        pytest.param("http://user:pw@host/v1", id="credentials"),
        pytest.param("http://host/v1?x=1", id="query"),
        pytest.param("http://h\u00f6st/v1", id="non-ascii"),
    ],
)
def test_a_malformed_base_url_is_refused_at_load(url: str) -> None:
    got = problems({"providers": {"o": {"kind": "openai", "base_url": url}},
                    "routes": {"chat": {"targets": [{"provider": "o", "model": "m"}]}}})
    assert [p for p in got if p.startswith("providers.o.base_url: ")], got


@pytest.mark.parametrize("key", ["sk-abc\r\nX-Evil: 1", "sk-abc\n", "sk-\x00abc", "sk-caf\u00e9"])
def test_a_provider_key_with_cr_lf_is_refused_at_load_without_printing_it(key: str) -> None:
    raw = {"providers": {"o": {"kind": "openai", "base_url": "http://h/v1", "api_key_env": "K"}},
           "routes": {"chat": {"targets": [{"provider": "o", "model": "m"}]}}}
    with pytest.raises(ConfigError) as caught:
        parse_config(raw, env={"K": key})
    text = str(caught.value)
    assert "providers.o.api_key_env: environment variable K" in text
    assert "sk-" not in text


def test_invalid_utf8_is_a_problem_not_a_traceback(tmp_path: Path) -> None:
    got = refused(tmp_path, BASE.encode() + b"listen: \xff\xfe\n")
    assert got == ["(file): not valid UTF-8 (line 5, byte 95)"]


@pytest.mark.parametrize(
    "nest",
    [pytest.param("[" * 5000 + "]" * 5000, id="flow-5000"), pytest.param("[" * 300 + "]" * 300, id="flow-300"),
     pytest.param("- " * 3000 + "x", id="block-3000")],
)
def test_very_deep_yaml_is_refused_quickly(tmp_path: Path, nest: str) -> None:
    import time

    t0 = time.monotonic()
    got = refused(tmp_path, BASE + f"x: {nest}\n")
    assert time.monotonic() - t0 < 0.5
    assert got == ["(file): nested too deeply (at most 64 levels)"]


def test_an_alias_bomb_is_refused_in_well_under_a_second_and_never_printed(tmp_path: Path) -> None:
    """Nine references per level over twelve levels: 282 billion nodes if anything expanded them."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 13)]
    import time

    for where in ("listen: *a12\n", "routes:\n  chat: {targets: *a12}\n"):
        text = "\n".join(lines) + "\n" + BASE.replace("routes:\n  chat: {targets: [{provider: s, model: m}]}\n", "")
        t0 = time.monotonic()
        got = refused(tmp_path, text + where)
        assert time.monotonic() - t0 < 0.5
        assert any("aliases expand to more than 100000 nodes" in p for p in got), got
        assert sum(len(p) for p in got) < 2000


def test_a_value_in_a_problem_is_shown_bounded() -> None:
    shared: list[Any] = ["x"] * 50
    for _ in range(6):
        shared = [shared] * 50  # 50**7 leaves if printed whole
    got = problems({"providers": {"s": {"kind": "simulated"}}, "listen": "x" * 100_000,
                    "routes": {"chat": {"strategy": shared, "targets": [{"provider": "s", "model": "m"}]}}})
    assert len(got) == 2 and sum(len(p) for p in got) < 600, got


def test_anchors_and_aliases_still_share_values(tmp_path: Path) -> None:
    path = tmp_path / "routes.yaml"
    path.write_text(textwrap.dedent("""\
        providers:
          a: {kind: openai, base_url: "http://a/v1", timeouts: &t {connect: 2, first_chunk: 3}}
          b: {kind: openai, base_url: "http://b/v1", timeouts: *t}
        routes:
          chat: {targets: [{provider: a, model: m}, {provider: b, model: m}]}
        connections: {max: 100, header_timeout: 5, body_timeout: 20, keepalive_timeout: 30}
        """))
    config = load_config(path, env={})
    assert config.providers["b"].timeouts.first_chunk == 3
    assert (config.connections.max, config.connections.header_timeout) == (100, 5)


def test_fail_over_on_is_read_into_the_route() -> None:
    raw = {"providers": {"s": {"kind": "simulated"}},
           "routes": {"chat": {"targets": [{"provider": "s", "model": "m"}], "fail_over_on": [404, 422]}}}
    assert parse_config(raw, env={}).routes["chat"].fail_over_on == (404, 422)


def key_file_config(key_file: str) -> dict[str, Any]:
    return {"providers": {"o": {"kind": "openai", "base_url": "http://h/v1", "api_key_file": key_file}},
            "routes": {"chat": {"targets": [{"provider": "o", "model": "m"}]}}}


def test_api_key_file_is_read_without_its_line_end_and_relative_to_the_routes_file(tmp_path: Path) -> None:
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "openai").write_text("sk-from-file\n")
    routes = tmp_path / "routes.yaml"
    routes.write_text(textwrap.dedent("""\
        providers:
          o: {kind: openai, base_url: "http://h/v1", api_key_file: keys/openai}
          c: {kind: openai, base_url: "http://h/v1", api_key_file: "${CREDENTIALS_DIRECTORY}/openai"}
        routes:
          chat: {targets: [{provider: o, model: m}, {provider: c, model: m}]}
        """))
    config = load_config(routes, env={"CREDENTIALS_DIRECTORY": str(tmp_path / "keys")})
    assert config.providers["o"].api_key == "sk-from-file"
    assert config.providers["c"].api_key == "sk-from-file"
    assert config.providers["o"].has_credentials
    assert "sk-from-file" not in repr(config.providers["o"])


def test_an_empty_key_file_is_no_credentials_like_an_unset_variable(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("\n")
    config = parse_config(key_file_config(str(tmp_path / "key")), env={})
    assert config.providers["o"].api_key is None and not config.providers["o"].has_credentials


@pytest.mark.parametrize(
    ("provider", "problem"),
    [
        pytest.param({"api_key_file": "/nonexistent/firstbyte-key"}, "providers.o.api_key_file: cannot read "
                     "/nonexistent/firstbyte-key: No such file or directory", id="missing-file"),
        pytest.param({"api_key_file": "${CREDENTIALS_DIRECTORY}/o"}, "providers.o.api_key_file: names "
                     "${CREDENTIALS_DIRECTORY}, which is not set (under systemd, LoadCredential= sets "
                     "$CREDENTIALS_DIRECTORY)", id="unset-credentials-directory"),
        pytest.param({"api_key_file": "/dev/null", "api_key_env": "K"}, "providers.o.api_key_file: set api_key_env "
                     "or api_key_file, not both", id="both"),
    ],
)
def test_api_key_file_problems(provider: dict[str, Any], problem: str) -> None:
    raw = key_file_config("")
    raw["providers"]["o"] = {"kind": "openai", "base_url": "http://h/v1", **provider}
    assert problems(raw) == [problem]


def test_a_key_file_with_a_line_break_inside_is_refused_without_printing_it(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("sk-one\r\nInjected: yes\n")
    text = "\n".join(problems(key_file_config(str(tmp_path / "key"))))
    assert "providers.o.api_key_file: file" in text and "printable ASCII" in text
    assert "sk-one" not in text and "Injected" not in text
