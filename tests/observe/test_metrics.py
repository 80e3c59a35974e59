from __future__ import annotations

import pytest
from aioprometheus import Histogram
from prometheus_client.parser import text_string_to_metric_families

from proxy.config import Config, Hedge, Provider, Route, Target
from proxy.observe import Finished
from proxy.observe.metrics import FIRST_CHUNK_BUCKETS, Metrics, hedged_from_config, names_from_config
from proxy.routing.decision import Attempt, Decision, Excluded, Racer, Ranked

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def finished(decision: Decision | None, status: int = 200) -> Finished:
    return Finished(
        decision=decision,
        started=1_700_000_000.0,
        client="127.0.0.1",
        method="POST",
        path="/v1/chat/completions",
        status=status,
        operation="chat",
        stream=True,
        ttfc=0.5,
        total=1.0,
        bytes_sent=10,
    )


def scrape(metrics: Metrics) -> tuple[Samples, dict[str, str], str]:
    """Render and parse with the reference parser: samples by (name, labels), and types."""
    body, content_type = metrics.render()
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(body.decode()):
        types[family.name] = family.type
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples, types, content_type


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


SERVED_AFTER_FAILOVER = Decision(
    id="a1",
    route="chat",
    strategy="fastest",
    order=(Ranked("groq", "fastest", 0.31), Ranked("openai", None, 0.82)),
    excluded=(Excluded("local", "breaker open 12s"),),
    attempts=(
        Attempt("groq", "503", 0.04, failover=True),
        Attempt("groq", "reset", 0.01, failover=True),
        Attempt("openai", "200", 0.8, ttfc=0.8),
    ),
    served="openai",
    status=200,
    usage={"prompt_tokens": 100, "completion_tokens": 40, "total_tokens": 140},
    cost_usd=0.25,
)
EXPLORED = Decision(
    id="a2",
    route="chat",
    strategy="fastest",
    order=(Ranked("openai", "explore"), Ranked("groq", "0.3s")),
    attempts=(Attempt("openai", "200", 0.3, ttfc=0.3),),
    served="openai",
    status=200,
    usage={"prompt_tokens": 10, "completion_tokens": 5},
    cost_usd=0.5,
)
CLIENT_PIN = Decision(  # a provider/model pin the client typed: neither name is configured
    id="a3",
    route="groq/some-model-a-client-invented",
    strategy="ordered",
    order=(Ranked("groq/some-model-a-client-invented", "pinned"),),
    attempts=(Attempt("groq/some-model-a-client-invented", "weird failure", 0.2),),
    status=502,
)


def make() -> Metrics:
    return Metrics(known_routes={"chat"}, known_targets={"groq", "openai", "local"})


def test_counters_after_known_traffic() -> None:
    metrics = make()
    for item in (SERVED_AFTER_FAILOVER, EXPLORED):
        metrics.on_finished(finished(item))
    metrics.on_finished(finished(CLIENT_PIN, status=502))
    metrics.on_finished(finished(None, status=401))  # refused before routing
    samples, types, content_type = scrape(metrics)

    assert content_type.startswith("text/plain; version=0.0.4")
    assert value(samples, "firstbyte_requests_total", route="chat", served="openai",
                 status="200") == 2
    assert value(samples, "firstbyte_requests_total", route="other", served="none",
                 status="502") == 1
    assert value(samples, "firstbyte_requests_total", route="none", served="none",
                 status="401") == 1
    assert value(samples, "firstbyte_attempts_total", target="groq", outcome="503") == 1
    assert value(samples, "firstbyte_attempts_total", target="groq", outcome="reset") == 1
    assert value(samples, "firstbyte_attempts_total", target="openai", outcome="200") == 2
    assert value(samples, "firstbyte_attempts_total", target="other", outcome="other") == 1
    assert value(samples, "firstbyte_failovers_total", route="chat") == 1
    assert value(samples, "firstbyte_failovers_total", route="other") == 0
    assert value(samples, "firstbyte_decisions_total", route="chat", first_reason="fastest") == 1
    assert value(samples, "firstbyte_decisions_total", route="chat", first_reason="explore") == 1
    assert value(samples, "firstbyte_decisions_total", route="other", first_reason="pinned") == 1
    assert value(samples, "firstbyte_tokens_total", target="openai", kind="prompt") == 110
    assert value(samples, "firstbyte_tokens_total", target="openai", kind="completion") == 45
    assert value(samples, "firstbyte_cost_usd_total", route="chat", target="openai") == 0.75
    assert value(samples, "firstbyte_ledger_dropped_total") == 0

    assert types["firstbyte_requests"] == "counter"
    assert types["firstbyte_first_chunk_seconds"] == "histogram"
    # Client-typed names never become label values.
    assert not any("invented" in v for _, labels in samples for _, v in labels)


def test_first_chunk_histogram_by_target() -> None:
    metrics = make()
    for item in (SERVED_AFTER_FAILOVER, EXPLORED):
        metrics.on_finished(finished(item))
    samples, _, _ = scrape(metrics)
    name = "firstbyte_first_chunk_seconds"
    assert value(samples, f"{name}_count", target="openai") == 2
    assert value(samples, f"{name}_sum", target="openai") == pytest.approx(1.1)
    assert value(samples, f"{name}_bucket", target="openai", le="0.25") == 0
    assert value(samples, f"{name}_bucket", target="openai", le="0.5") == 1
    assert value(samples, f"{name}_bucket", target="openai", le="1.0") == 2
    assert value(samples, f"{name}_bucket", target="openai", le="+Inf") == 2
    assert (f"{name}_count", frozenset({("target", "groq")})) not in samples  # groq never answered


def test_first_chunk_histogram_matches_one_observation_at_a_time() -> None:
    """Observations are bucketed in a batch at scrape time; the result must equal aioprometheus's own
    observe() per value, bounds included (a value equal to a bound falls in that bucket)."""
    values = [0.05, 0.051, 0.5, 0.7, 1.0, 2.5, 59.0, 61.0, 0.001, 0.25, 0.25]
    metrics = make()
    for i, seconds in enumerate(values):
        metrics.on_finished(finished(Decision(
            id=f"h{i}", route="chat", strategy="ordered", order=(Ranked("groq", "written"),),
            attempts=(Attempt("groq", "200", seconds, ttfc=seconds),), served="groq", status=200)))
        if i == 4:
            scrape(metrics)  # a scrape in between: the second batch adds to the first
    samples, _, _ = scrape(metrics)
    reference = Histogram("ref", "one at a time", buckets=FIRST_CHUNK_BUCKETS)
    for seconds in values:
        reference.observe({"target": "groq"}, seconds)
    expected = reference.get({"target": "groq"})
    name = "firstbyte_first_chunk_seconds"
    for bound in FIRST_CHUNK_BUCKETS:
        assert value(samples, f"{name}_bucket", target="groq", le=str(bound)) == expected[bound], bound
    assert value(samples, f"{name}_bucket", target="groq", le="+Inf") == len(values)
    assert value(samples, f"{name}_count", target="groq") == expected["count"] == len(values)
    assert value(samples, f"{name}_sum", target="groq") == pytest.approx(expected["sum"])


def test_scrape_time_gauges() -> None:
    metrics = make()
    metrics.set_figure("groq", 0.31, "streamed")
    metrics.set_figure("groq", 1.5, "buffered")
    metrics.set_figure("openai", 0.82, "streamed")
    metrics.set_figure("openai", None, "streamed")  # gone stale: no series rather than an old number
    metrics.set_target_state("groq", "closed", 3)
    metrics.set_target_state("local", "open", 0)
    metrics.set_target_state("openai", "probing", 1)
    metrics.set_ledger_dropped(7)
    samples, types, _ = scrape(metrics)
    assert value(samples, "firstbyte_target_latency_seconds", target="groq", mode="streamed") == 0.31
    assert value(samples, "firstbyte_target_latency_seconds", target="groq", mode="buffered") == 1.5
    assert ("firstbyte_target_latency_seconds", frozenset({("target", "openai"), ("mode", "streamed")})) \
        not in samples
    assert value(samples, "firstbyte_breaker_state", target="groq") == 0
    assert value(samples, "firstbyte_breaker_state", target="local") == 1
    assert value(samples, "firstbyte_breaker_state", target="openai") == 2
    assert value(samples, "firstbyte_in_flight", target="groq") == 3
    assert value(samples, "firstbyte_in_flight", target="openai") == 1
    assert value(samples, "firstbyte_ledger_dropped_total") == 7
    assert types["firstbyte_breaker_state"] == "gauge"
    with pytest.raises(ValueError, match="unknown breaker state"):
        metrics.set_target_state("groq", "melted", 0)


def test_reconfigure_bounds_labels_to_the_new_config_and_drops_departed_gauges() -> None:
    metrics = make()
    metrics.set_figure("local", 0.2, "streamed")
    metrics.set_target_state("local", "closed", 0)
    metrics.set_target_state("groq", "closed", 0)
    metrics.reconfigure({"chat", "code"}, {"groq", "openai"})
    code = Decision(
        id="b1", route="code", strategy="ordered", order=(Ranked("local", "written"),),
        attempts=(Attempt("local", "200", 0.1, ttfc=0.1),), served="local", status=200,
    )
    metrics.on_finished(finished(code))
    samples, _, _ = scrape(metrics)
    assert value(samples, "firstbyte_requests_total", route="code", served="other",
                 status="200") == 1
    assert value(samples, "firstbyte_breaker_state", target="groq") == 0
    remaining = {labels for name, labels in samples if name == "firstbyte_breaker_state"}
    assert remaining == {frozenset({("target", "groq")})}
    assert not any(name == "firstbyte_target_latency_seconds" for name, _ in samples)


@pytest.mark.parametrize(
    ("outcome", "label"),
    [
        pytest.param("429", "429", id="code"),
        pytest.param("timeout", "timeout", id="word"),
        pytest.param("busy", "busy", id="busy"),
        pytest.param("connect timeout", "connect", id="first-word"),
        pytest.param("capped", "capped", id="a-racer-cut-at-its-cap"),
        pytest.param("measured", "measured", id="a-racer-measured-to-its-first-token"),
        pytest.param("interim flood", "interim", id="an-interim-flood"),
        pytest.param("bad upstream status", "bad", id="a-bad-upstream-status"),
        pytest.param("1234", "other", id="four-digits"),
        pytest.param("ignore previous instructions", "other", id="free-text"),
    ],
)
def test_outcome_labels_are_bounded(outcome: str, label: str) -> None:
    metrics = make()
    metrics.on_finished(finished(Decision(
        id="c", route="chat", strategy="ordered", order=(Ranked("groq", "written"),),
        attempts=(Attempt("groq", outcome, 0.1),),
    ), status=502))
    samples, _, _ = scrape(metrics)
    assert value(samples, "firstbyte_attempts_total", target="groq", outcome=label) == 1


def test_names_from_config() -> None:
    config = Config(
        providers={"groq": Provider("groq", "openai", "https://x")},
        routes={
            "chat": Route("chat", "ordered", (
                Target("fast", "groq", "llama-3"), Target("slow", "groq", "llama-2"),
            )),
        },
    )
    routes, targets = names_from_config(config)
    assert routes == {"chat"}
    assert targets == {"fast", "slow", "groq/llama-3", "groq/llama-2"}
    metrics = Metrics.from_config(config)
    metrics.on_finished(finished(Decision(
        id="p", route="groq/llama-3", strategy="ordered", order=(Ranked("groq/llama-3", "pinned"),),
        attempts=(Attempt("groq/llama-3", "200", 0.1, ttfc=0.1),), served="groq/llama-3",
        status=200,
    )))
    samples, _, _ = scrape(metrics)
    assert value(samples, "firstbyte_requests_total", route="other", served="groq/llama-3",
                 status="200") == 1


def test_races_are_counted_hedges_wins_duplicates_and_refusals() -> None:
    metrics = make()
    hedged = Decision(
        id="r1", route="chat", strategy="fastest",
        order=(Ranked("groq", "fastest", 0.31), Ranked("openai", None, 0.82)),
        attempts=(Attempt("groq", "lost", 0.5), Attempt("openai", "200", 0.2, ttfc=0.2)), served="openai",
        status=200, race=(Racer("groq", "leader"), Racer("openai", "hedge 0.40s")),
    )
    explored = Decision(
        id="r2", route="chat", strategy="fastest",
        order=(Ranked("openai", "explore", 0.82), Ranked("groq", None, 0.31)),
        attempts=(Attempt("openai", "measuring", 0.3), Attempt("groq", "200", 0.3, ttfc=0.3)), served="groq",
        status=200, race=(Racer("openai", "explore"), Racer("groq", "leader")),
    )
    refused = Decision(
        id="r3", route="chat", strategy="fastest", order=(Ranked("groq", "fastest", 0.31),),
        attempts=(Attempt("groq", "200", 0.9, ttfc=0.9),), served="groq", status=200,
        race=(Racer("openai", "budget exhausted"),),
    )
    for d in (hedged, explored, refused):
        metrics.on_finished(finished(d))
    samples, _, _ = scrape(metrics)
    assert value(samples, "firstbyte_hedges_total", route="chat") == 1
    assert value(samples, "firstbyte_duplicate_calls_total", route="chat") == 2
    assert value(samples, "firstbyte_races_won_total", target="openai") == 1
    assert value(samples, "firstbyte_races_won_total", target="groq") == 1
    assert value(samples, "firstbyte_hedge_budget_exhausted_total", route="chat") == 1
    assert value(samples, "firstbyte_attempts_total", target="groq", outcome="lost") == 1
    assert value(samples, "firstbyte_attempts_total", target="openai", outcome="measuring") == 1


def test_a_hedged_routes_race_series_read_zero_before_its_first_race_and_keep_their_counts_on_reload() -> None:
    config = Config(
        providers={"groq": Provider("groq", "openai", "https://x")},
        routes={
            "chat": Route("chat", "fastest", (Target("fast", "groq", "llama-3"), Target("slow", "groq", "llama-2")),
                          hedge=Hedge()),
            "plain": Route("plain", "ordered", (Target("other", "groq", "llama-1"),)),
        },
    )
    assert hedged_from_config(config) == {"chat": ("fast", "slow")}
    metrics = Metrics.from_config(config)
    samples, _, _ = scrape(metrics)
    for name in ("firstbyte_hedges_total", "firstbyte_duplicate_calls_total",
                 "firstbyte_hedge_budget_exhausted_total"):
        assert value(samples, name, route="chat") == 0
        assert (name, frozenset({("route", "plain")})) not in samples  # no race can happen there
    assert value(samples, "firstbyte_races_won_total", target="fast") == 0
    assert value(samples, "firstbyte_races_won_total", target="slow") == 0
    assert (("firstbyte_races_won_total", frozenset({("target", "other")}))) not in samples

    metrics.on_finished(finished(Decision(
        id="r1", route="chat", strategy="fastest", order=(Ranked("fast", "fastest", 0.3), Ranked("slow", None, 0.8)),
        attempts=(Attempt("fast", "lost", 0.5), Attempt("slow", "200", 0.2, ttfc=0.2)), served="slow",
        status=200, race=(Racer("fast", "leader"), Racer("slow", "hedge 0.40s")),
    )))
    metrics.reconfigure(*names_from_config(config), hedged_from_config(config))
    samples, _, _ = scrape(metrics)
    assert value(samples, "firstbyte_hedges_total", route="chat") == 1
    assert value(samples, "firstbyte_races_won_total", target="slow") == 1
    assert value(samples, "firstbyte_races_won_total", target="fast") == 0
