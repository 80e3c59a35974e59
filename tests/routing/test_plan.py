"""The pure planner as tables: config + state + a hand-moved clock + a seeded generator -> header.

Every case states the exact ``x-route-decision`` line it must produce, so a change
in eligibility, ordering or the header grammar shows up here first.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from proxy.config import Config, Cooldown, parse_config
from proxy.routing.plan import Ask, Refused, plan
from proxy.state import State

from .conftest import NOW, Setup, config, fig, t, unraced

# State builders: each returns a function that moves a fresh State into shape.


def opened(name: str, ago: float = 0.0, secs: float = 30.0) -> Setup:
    """The breaker opened ``ago`` seconds before NOW with a ``secs`` cooldown."""
    return lambda s: s.target((name, "m")).breaker.failure(NOW - ago, Cooldown(failures=1, secs=secs))


def probing(name: str) -> Setup:
    def setup(s: State) -> None:
        breaker = s.target((name, "m")).breaker
        breaker.failure(NOW - 40, Cooldown(failures=1, secs=30))
        assert breaker.begin(NOW - 1) == "probe"

    return setup


def peers_measure(*names: str, mode: str = "streamed") -> Setup:
    """Other instances of the fleet hold the measuring claims of these targets (fleet/measures.py)."""
    return lambda s: s.set_measuring(frozenset(((n, "m"), mode) for n in names))


def cooled(name: str, secs: float) -> Setup:
    """A 429 said Retry-After: ``secs`` from NOW."""
    return lambda s: s.target((name, "m")).breaker.cool(NOW + secs)


def header(cfg: Config, setups: tuple[Setup, ...] = (), seed: int = 7, explore: bool = True,
           **ask: Any) -> str:
    state = State()
    for setup in setups:
        setup(state)
    planned = plan(cfg, Ask(id="t1", model=ask.pop("model", "chat"), **ask), state, NOW,
                   random.Random(seed), explore=explore)
    return planned.decision.header()


H = "id=t1; route=chat; strategy="

ELIGIBILITY = [
    pytest.param(config("ordered", [t("a"), t("b"), t("c")]), (), {},
                 H + "ordered; order=a(written), b(unmeasured), c(unmeasured)", id="ordered-as-written"),
    pytest.param(config("ordered", [t("a"), t("b")]), (fig("a", 0.5), fig("b", 0.2)), {},
                 H + "ordered; order=a(written 0.50s), b(0.20s)", id="ordered-ignores-speed"),
    pytest.param(config("ordered", [t("a"), t("b"), t("c")], deny=["b"]), (), {},
                 H + "ordered; order=a(written), c(unmeasured); excluded=b(deny)", id="deny"),
    pytest.param(config("ordered", [t("a"), t("b"), t("c")], allow=["c", "a"]), (), {},
                 H + "ordered; order=a(written), c(unmeasured); excluded=b(not in allow)", id="allow"),
    pytest.param(config("ordered", [t("a"), t("b")], allow=["a"], deny=["b"]), (), {},
                 H + "ordered; order=a(written); excluded=b(not in allow)", id="allow-before-deny-one-reason"),
    pytest.param(config("ordered", [t("a", context_window=8192), t("b", context_window=32000), t("c")]), (),
                 {"tokens": 9000},
                 H + "ordered; order=b(written), c(unmeasured); excluded=a(context 8192 < 9000)",
                 id="context-window-against-request-size"),
    pytest.param(config("ordered", [t("a", context_window=8192), t("b")]), (), {"tokens": 8192},
                 H + "ordered; order=a(written), b(unmeasured)", id="request-exactly-fits"),
    pytest.param(config("ordered", [t("a", context_window=8192), t("b", context_window=64000), t("c")],
                        min_context_window=32000), (), {},
                 H + "ordered; order=b(written); excluded=a(context window 8192 below min 32000), "
                 "c(context window undeclared below min 32000)", id="min-context-floor-undeclared-fails"),
    pytest.param(config("ordered", [t("a", quality=0.9), t("b", quality=0.5), t("c")], min_quality=0.7), (), {},
                 H + "ordered; order=a(written); excluded=b(quality 0.5 below min 0.7), "
                 "c(quality undeclared below min 0.7)", id="min-quality-floor"),
    pytest.param(config("ordered", [t("a", context_window=4096), t("b")]), (), {"tokens": 5000},
                 H + "ordered; order=b(written); excluded=a(context 4096 < 5000)", id="size-before-floor"),
    pytest.param(config("ordered", [t("nokey"), t("a")]), (), {},
                 H + "ordered; order=a(written); excluded=nokey(no credentials)", id="no-credentials"),
    pytest.param(config("ordered", [t("nokey", context_window=10)], deny=[]), (), {"tokens": 20},
                 H + "ordered; order=; excluded=nokey(context 10 < 20)", id="capability-before-credentials"),
    pytest.param(config("ordered", [t("nokey"), t("a")]), (opened("nokey"),), {},
                 H + "ordered; order=a(written); excluded=nokey(no credentials)", id="credentials-before-health"),
    pytest.param(config("ordered", [t("a"), t("b")], deny=["a"]), (opened("a"),), {},
                 H + "ordered; order=b(written); excluded=a(deny)", id="deny-before-health"),
    pytest.param(config("ordered", [t("a"), t("b")]), (opened("a", ago=18.0),), {},
                 H + "ordered; order=b(written); excluded=a(breaker open 12s)", id="breaker-open-seconds-left"),
    pytest.param(config("ordered", [t("a"), t("b")]), (opened("a", ago=17.6),), {},
                 H + "ordered; order=b(written); excluded=a(breaker open 13s)", id="breaker-seconds-round-up"),
    pytest.param(config("ordered", [t("a"), t("b")]), (opened("a", ago=31.0),), {},
                 H + "ordered; order=a(written), b(unmeasured)", id="breaker-half-open-may-probe"),
    pytest.param(config("ordered", [t("a"), t("b")]), (probing("a"),), {},
                 H + "ordered; order=b(written); excluded=a(breaker probing)", id="probe-in-flight-excludes"),
    pytest.param(config("ordered", [t("a"), t("b")]), (cooled("a", 7.0),), {},
                 H + "ordered; order=b(written); excluded=a(cooling down 7s)", id="retry-after-cooling"),
    pytest.param(config("ordered", [t("a"), t("b")]), (opened("a", ago=10.0), cooled("b", 4.0)), {},
                 H + "ordered; order=b(soonest to reopen); excluded=a(breaker open 20s)",
                 id="all-unhealthy-keeps-soonest-to-reopen"),
    pytest.param(config("ordered", [t("a"), t("b"), t("c")], deny=["c"]), (opened("a", ago=25.0), opened("b")), {},
                 H + "ordered; order=a(soonest to reopen); excluded=c(deny), b(breaker open 30s)",
                 id="rescue-only-among-what-hard-filters-left"),
    pytest.param(config("ordered", [t("a"), t("b")], deny=["a", "b"]), (), {},
                 H + "ordered; order=; excluded=a(deny), b(deny)", id="hard-filters-may-empty-the-pool"),
]


@pytest.mark.parametrize(("cfg", "setups", "ask", "expected"), ELIGIBILITY)
def test_eligibility(cfg: Config, setups: tuple[Setup, ...], ask: dict[str, Any], expected: str) -> None:
    assert header(cfg, setups, **ask) == expected


W = [t("a", weight=1), t("b", weight=3), t("c", weight=0), t("d", weight=6)]
Q = {"quality_weight": 0.5, "latency_target_ms": 2000, "explore": 0}

ORDERING = [
    pytest.param(config("weighted", W), (), {}, 1,
                 H + "weighted; order=b(weighted), d(unmeasured), a(unmeasured), c(unmeasured)",
                 id="weighted-seed-1-zero-weight-last"),
    pytest.param(config("weighted", W), (), {}, 5,
                 H + "weighted; order=d(weighted), b(unmeasured), a(unmeasured), c(unmeasured)",
                 id="weighted-seed-5"),
    pytest.param(unraced([t("a"), t("b"), t("c")]), (fig("b", 0.3),), {}, 7,
                 H + "fastest; order=a(unmeasured), c(unmeasured), b(0.30s)", id="fastest-unmeasured-first-written"),
    pytest.param(unraced([t("a"), t("b"), t("c")], fastest={"explore": 0}),
                 (fig("a", 0.9), fig("b", 0.3), fig("c", 0.5)), {}, 7,
                 H + "fastest; order=b(fastest 0.30s), c(0.50s), a(0.90s)", id="fastest-by-figure"),
    pytest.param(unraced([t("a"), t("b"), t("c")]), (peers_measure("a", "b"),), {}, 7,
                 H + "fastest; order=c(unmeasured), a(unmeasured), b(unmeasured)",
                 id="fastest-peers-measure-a-and-b-this-one-c"),
    pytest.param(unraced([t("a"), t("b"), t("c")]), (peers_measure("a"), fig("c", 0.5)), {}, 7,
                 H + "fastest; order=b(unmeasured), c(0.50s), a(unmeasured)",
                 id="fastest-a-peer-measures-a-it-goes-behind-the-measured"),
    pytest.param(unraced([t("a"), t("b")]), (peers_measure("a", "b"),), {}, 7,
                 H + "fastest; order=a(unmeasured), b(unmeasured)",
                 id="fastest-peers-measure-all-no-wait-fewest-first"),
    pytest.param(unraced([t("a"), t("b")]), (peers_measure("a", mode="buffered"),), {}, 7,
                 H + "fastest; order=a(unmeasured), b(unmeasured)",
                 id="fastest-a-peers-buffered-claim-leaves-streamed-alone"),
    pytest.param(unraced([t("a"), t("b"), t("c")], fastest={"explore": 1.0}),
                 (fig("a", 0.9), fig("b", 0.3), fig("c", 0.5)), {}, 7,
                 H + "fastest; order=c(explore 0.50s), b(0.30s), a(0.90s)", id="fastest-explore-seeded"),
    pytest.param(unraced([t("a"), t("b"), t("c")], fastest={"explore": 1.0}),
                 (fig("a", 0.9), fig("b", 0.3), fig("c", 0.5)), {"explore": False}, 7,
                 H + "fastest; order=b(fastest 0.30s), c(0.50s), a(0.90s)", id="fastest-explain-never-explores"),
    pytest.param(unraced([t("a"), t("b")], fastest={"explore": 0, "signal": "ewma", "alpha": 0.3}),
                 (fig("a", 0.1, 0.1, 0.1, 1.0), fig("b", 0.3, 0.3, 0.3, 0.3)), {}, 7,
                 H + "fastest; order=b(fastest 0.30s), a(0.37s)", id="fastest-ewma-feels-the-spike"),
    pytest.param(unraced([t("a"), t("b")], fastest={"explore": 0, "signal": "p50"}),
                 (fig("a", 0.1, 0.1, 0.1, 1.0), fig("b", 0.3, 0.3, 0.3, 0.3)), {}, 7,
                 H + "fastest; order=a(fastest 0.10s), b(0.30s)", id="fastest-p50-ignores-the-spike"),
    pytest.param(unraced([t("a"), t("b")], fastest={"explore": 0, "signal": "p50", "window": 2}),
                 (fig("a", 0.1, 0.1, 0.1, 1.0), fig("b", 0.3, 0.3, 0.3, 0.3)), {}, 7,
                 H + "fastest; order=b(fastest 0.30s), a(0.55s)", id="fastest-p50-over-window"),
    pytest.param(unraced([t("a"), t("b")], fastest={"explore": 0, "signal": "ewma", "alpha": 0.3}),
                 (fig("a", *[1.0] * 10, 0.1), fig("b", 0.3, 0.3)), {}, 7,
                 H + "fastest; order=a(fastest 0.28s), b(0.30s)", id="fastest-ewma-recovery-taken-at-once"),
    pytest.param(unraced([t("a"), t("b")], fastest={"explore": 0, "signal": "p50"}),
                 (fig("a", *[1.0] * 10, 0.1), fig("b", 0.3, 0.3)), {}, 7,
                 H + "fastest; order=a(fastest 0.28s), b(0.30s)", id="fastest-p50-recovery-taken-at-once"),
    pytest.param(unraced([t("a"), t("b")], fastest={"explore": 0, "signal": "ewma", "alpha": 0.3}),
                 (fig("a", *[1.0] * 10, 0.6), fig("b", 0.7, 0.7)), {}, 7,
                 H + "fastest; order=b(fastest 0.70s), a(0.88s)", id="fastest-less-than-halved-is-smoothed"),
    pytest.param(config("ordered", [t("a"), t("b")], fastest={"alpha": 0.3}),
                 (fig("a", *[1.0] * 10, 0.1), fig("b", 0.3, 0.3)), {}, 7,
                 H + "ordered; order=a(written 0.73s), b(0.30s)", id="recovery-rule-is-fastest-only"),
    pytest.param(unraced([t("a"), t("b")], fastest={"explore": 0, "min_samples": 2}),
                 (fig("a", 0.1), fig("b", 0.3, 0.3)), {}, 7,
                 H + "fastest; order=a(unmeasured), b(0.30s)", id="fastest-too-few-samples-is-unmeasured"),
    pytest.param(unraced([t("a"), t("b")], fastest={"explore": 0, "max_age_secs": 60}),
                 (fig("a", 0.1, ago=61), fig("b", 0.3, ago=59)), {}, 7,
                 H + "fastest; order=a(unmeasured), b(0.30s)", id="fastest-stale-figure-is-unmeasured"),
    pytest.param(unraced([t("a", quality=1.0), t("b", quality=0.1)],
                        fastest={**Q, "quality_weight": 0}),
                 (fig("a", 3.0), fig("b", 1.0)), {}, 7,
                 H + "fastest; order=b(fastest 1.00s), a(3.00s)", id="quality-weight-0-is-speed-order"),
    pytest.param(unraced([t("a", quality=0.2), t("b", quality=1.0)], fastest=Q),
                 (fig("a", 1.0), fig("b", 3.0)), {}, 7,
                 H + "fastest; order=b(fastest 3.00s), a(1.00s)", id="quality-blend-prefers-quality"),
    pytest.param(unraced([t("a", quality=0.8), t("b", quality=0.8)], fastest=Q),
                 (fig("a", 0.9), fig("b", 0.5)), {}, 7,
                 H + "fastest; order=b(fastest 0.50s), a(0.90s)", id="quality-blend-tie-by-speed"),
    pytest.param(unraced([t("a", quality=0.6), t("b")], fastest={**Q, "unknown_quality": 0.7}),
                 (fig("a", 1.0), fig("b", 1.0)), {}, 7,
                 H + "fastest; order=b(fastest 1.00s), a(1.00s)", id="quality-undeclared-counts-unknown_quality"),
    pytest.param(config("cheapest", [t("a", price={"input": 3, "output": 15}), t("b"),
                                     t("c", price={"input": 0.5, "output": 1.5})]), (), {}, 7,
                 H + "cheapest; order=c(cheapest 2/M), a(18/M), b(no price)", id="cheapest-undeclared-last"),
    pytest.param(config("cheapest", [t("a", price={"input": 1, "output": 1}),
                                     t("b", price={"input": 1.5, "output": 0.5}),
                                     t("c", price={"input": 2, "output": 0})]),
                 (fig("a", 0.9), fig("c", 0.4)), {}, 7,
                 H + "cheapest; order=c(cheapest 2/M), a(2/M), b(2/M)", id="cheapest-ties-by-measured-speed"),
    pytest.param(config("cheapest", [t("a", price={"input": 0.1, "output": 0.1}, context_window=4096),
                                     t("b", price={"input": 5, "output": 5}, context_window=128000),
                                     t("c", price={"input": 0.2, "output": 0.2}),
                                     t("d", price={"input": 0, "output": 0})],
                        deny=["d"]), (), {"tokens": 6000}, 7,
                 H + "cheapest; order=c(cheapest 0.4/M), b(10/M); excluded=a(context 4096 < 6000), d(deny)",
                 id="deny-then-capability-then-cheapest"),
]


@pytest.mark.parametrize(("cfg", "setups", "ask", "seed", "expected"), ORDERING)
def test_ordering(cfg: Config, setups: tuple[Setup, ...], ask: dict[str, Any], seed: int, expected: str) -> None:
    explore = ask.pop("explore", True)
    assert header(cfg, setups, seed=seed, explore=explore, **ask) == expected


PINS = [
    pytest.param(config("ordered", [t("a"), t("b"), t("c")]), (), {"pin": "b"},
                 H + "ordered; order=b(pinned), a(unmeasured), c(unmeasured)", id="pin-goes-first-rest-is-fallback"),
    pytest.param(unraced([t("a"), t("b"), t("c")], fastest={"explore": 1.0}),
                 (fig("a", 0.5), fig("b", 0.9), fig("c", 0.2)), {"pin": "b"},
                 H + "fastest; order=b(pinned 0.90s), c(0.20s), a(0.50s)", id="pin-then-fastest-without-explore"),
    pytest.param(config("ordered", [t("a"), t("b")]), (opened("a"),), {"pin": "b"},
                 H + "ordered; order=b(pinned); excluded=a(breaker open 30s)", id="pin-with-fallback-breaker-open"),
    pytest.param(config("cheapest", [t("a", price={"input": 9, "output": 9}), t("b", price={"input": 1, "output": 1})]),
                 (), {"pin": "a"}, H + "cheapest; order=a(pinned), b(2/M)", id="pin-beats-cheapest"),
]


@pytest.mark.parametrize(("cfg", "setups", "ask", "expected"), PINS)
def test_pins(cfg: Config, setups: tuple[Setup, ...], ask: dict[str, Any], expected: str) -> None:
    assert header(cfg, setups, **ask) == expected


def test_direct_pin_is_a_one_target_route() -> None:
    cfg = config("ordered", [t("a")])
    expected = "id=t1; route=b/llama-3; strategy=ordered; order=b(pinned)"
    assert header(cfg, model="b/llama-3") == expected


REFUSED = [
    pytest.param(config("ordered", [t("a"), t("b")]), (opened("b", ago=5),), {"pin": "b"}, "pin_unavailable",
                 "breaker open 25s", H + "ordered; order=; excluded=b(breaker open 25s)", id="pin-and-breaker-open"),
    pytest.param(config("ordered", [t("a"), t("b")]), (probing("b"),), {"pin": "b"}, "pin_unavailable",
                 "breaker probing", H + "ordered; order=; excluded=b(breaker probing)", id="pin-and-probe-in-flight"),
    pytest.param(config("ordered", [t("a"), t("b")]), (cooled("b", 9),), {"pin": "b"}, "pin_unavailable",
                 "cooling down 9s", H + "ordered; order=; excluded=b(cooling down 9s)", id="pin-and-retry-after"),
    pytest.param(config("ordered", [t("b")]), (opened("b"),), {"pin": "b"}, "pin_unavailable",
                 "breaker open 30s", H + "ordered; order=; excluded=b(breaker open 30s)",
                 id="pin-never-rescued-by-health"),
    pytest.param(config("ordered", [t("a"), t("b")], deny=["b"]), (), {"pin": "b"}, "pin_unavailable",
                 "deny", H + "ordered; order=; excluded=b(deny)", id="pin-and-deny"),
    pytest.param(config("ordered", [t("a"), t("b")], allow=["a"]), (), {"pin": "b"}, "pin_unavailable",
                 "not in allow", H + "ordered; order=; excluded=b(not in allow)", id="pin-and-allow"),
    pytest.param(config("ordered", [t("a"), t("nokey")], deny=["a"]), (), {"pin": "nokey"}, "pin_unavailable",
                 "no credentials", H + "ordered; order=; excluded=nokey(no credentials), a(deny)",
                 id="pin-and-no-credentials-lists-others"),
    pytest.param(config("ordered", [t("a")]), (), {"model": "nokey/gpt"}, "pin_unavailable", "no credentials",
                 "id=t1; route=nokey/gpt; strategy=ordered; order=; excluded=nokey(no credentials)",
                 id="direct-pin-no-credentials"),
    pytest.param(config("ordered", [t("a")]), (), {"pin": "zz"}, "unknown_pin", "no target 'zz'", None,
                 id="unknown-pin"),
    pytest.param(config("ordered", [t("a")]), (), {"model": "grok/beta"}, "unknown_pin", "provider 'grok'", None,
                 id="direct-pin-unknown-provider"),
    pytest.param(config("ordered", [t("a")]), (), {"model": "a/x", "pin": "b"}, "unknown_pin", "contradicts", None,
                 id="direct-pin-and-other-header-pin"),
]


@pytest.mark.parametrize(("cfg", "setups", "ask", "code", "says", "expected"), REFUSED)
def test_refused_pins_are_400_naming_the_filter(
    cfg: Config, setups: tuple[Setup, ...], ask: dict[str, Any], code: str, says: str, expected: str | None
) -> None:
    with pytest.raises(Refused) as caught:
        header(cfg, setups, **ask)
    refused = caught.value
    assert (refused.status, refused.code) == (400, code)
    assert says in refused.message
    assert (refused.decision.header() if refused.decision else None) == expected


def test_unknown_route_is_404() -> None:
    with pytest.raises(Refused) as caught:
        header(config("ordered", [t("a")]), model="nope")
    assert (caught.value.status, caught.value.code) == (404, "model_not_found")


def test_weighted_draw_is_without_replacement_and_follows_the_weights() -> None:
    """Over many seeded draws the leader's share matches its weight, and no order repeats a target."""
    cfg = config("weighted", W)
    state, rng = State(), random.Random(42)
    leads = {"a": 0, "b": 0, "c": 0, "d": 0}
    n = 5000
    for _ in range(n):
        planned = plan(cfg, Ask("t1", "chat"), state, NOW, rng)
        names = [x.name for x in planned.targets]
        assert sorted(names) == ["a", "b", "c", "d"] and names[-1] == "c"
        leads[names[0]] += 1
    assert leads["c"] == 0
    for name, weight in (("a", 0.1), ("b", 0.3), ("d", 0.6)):
        assert abs(leads[name] / n - weight) < 0.02, leads


def test_planner_is_pure_no_aiohttp() -> None:
    """The routing package imports neither aiohttp nor anything doing I/O."""
    import ast
    import pathlib

    import proxy.routing

    for path in pathlib.Path(proxy.routing.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not {m for m in names if m.split(".")[0] in ("aiohttp", "asyncio", "sqlite3", "socket", "time")}, path


def test_the_hard_filters_verdict_is_kept_per_route_and_providers_not_reused_across_them() -> None:
    """Without a request size the hard filters read only the config, so their verdict is kept per
    route; a reload that takes a key away brings other providers, and the verdict must follow them."""
    from proxy.routing.eligibility import eligible

    raw = {"providers": {"a": {"kind": "simulated"},
                         "keyed": {"kind": "openai", "base_url": "http://127.0.0.1:9", "api_key_env": "K"}},
           "routes": {"chat": {"strategy": "ordered", "targets": [t("keyed"), t("a")]}}}
    with_key, without_key = parse_config(raw, env={"K": "sk-test"}), parse_config(raw, env={})
    route = with_key.routes["chat"]
    state = State()
    assert [x.name for x in eligible(route, with_key.providers, None, state, NOW).targets] == ["keyed", "a"]
    assert [x.name for x in eligible(route, with_key.providers, None, state, NOW).targets] == ["keyed", "a"]
    after = eligible(route, without_key.providers, None, state, NOW)
    assert [x.name for x in after.targets] == ["a"]
    assert [(x.name, x.reason) for x in after.excluded] == [("keyed", "no credentials")]
    sized = eligible(route, with_key.providers, 10, state, NOW)  # a request size: computed, not kept
    assert [x.name for x in sized.targets] == ["keyed", "a"]
