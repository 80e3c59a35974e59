"""scripts/simulate-pool: the oracle it measures against and the ratios it reports."""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import make_config, ok_handler

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


@pytest.fixture(scope="module")
def pool() -> ModuleType:
    sys.path.insert(0, str(SCRIPTS))
    try:
        spec = importlib.util.spec_from_file_location("simulate_pool", SCRIPTS / "simulate_pool.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(SCRIPTS))


def test_the_oracle_is_the_fastest_healthy_target_by_the_schedule(pool: ModuleType) -> None:
    scenario = {"A": {"first_chunk_ms": 25, "steps": [{"at": 0.5, "fail_rate": 0.6}]},
                "B": {"first_chunk_ms": 45},
                "C": {"first_chunk_ms": 70, "steps": [{"at": 0.75, "first_chunk_ms": 10}]}}
    at = {n: 0.0 for n in "ABC"}
    assert pool.oracle(scenario, at, 10.0) == ("A", 25)
    assert pool.oracle(scenario, {n: 5.0 for n in "ABC"}, 10.0) == ("B", 45)  # A fails: not healthy
    assert pool.oracle(scenario, {n: 8.0 for n in "ABC"}, 10.0) == ("C", 10)
    # Each simulator is at its own point in its schedule.
    assert pool.oracle(scenario, {"A": 4.0, "B": 4.0, "C": 8.0}, 10.0) == ("C", 10)


def calls(served: str, ttfc: list[float], oracle: str = "A", oracle_ms: float = 20.0,
          served_ms: float = 20.0) -> list[dict]:
    return [{"t": i * 0.01, "ok": True, "served": served, "ttfc_ms": ms, "oracle": oracle,
             "oracle_ms": oracle_ms, "served_ms": served_ms} for i, ms in enumerate(ttfc)]


def test_ratios_are_to_the_measured_oracle_and_to_the_schedule(pool: ModuleType) -> None:
    oracle_run = pool.summarise(calls("A", [22.0] * 19 + [40.0]), None)
    assert oracle_run["vs_oracle"] == 1.0 and oracle_run["p95_vs_oracle"] == 1.0
    assert oracle_run["oracle_mean_ms"] == pytest.approx(22.9)
    assert oracle_run["vs_sched"] == pytest.approx(22.9 / 20.0)  # the proxy's own cost shows here
    assert oracle_run["choice_vs_sched"] == 1.0
    run = pool.summarise(calls("B", [30.0] * 19 + [80.0], served_ms=25.0), None, oracle_run)
    assert run["mean_ms"] == pytest.approx(32.5)
    assert run["oracle_mean_ms"] == pytest.approx(22.9)
    assert run["vs_oracle"] == pytest.approx(32.5 / 22.9)
    assert run["p95_vs_oracle"] == pytest.approx(30.0 / 22.0)
    assert run["vs_sched"] == pytest.approx(32.5 / 20.0)
    assert run["choice_vs_sched"] == pytest.approx(25.0 / 20.0)  # B's scheduled time over A's
    assert run["on_oracle"] == 0.0 and run["share"] == {"A": 0.0, "B": 1.0, "C": 0.0}


def test_repeats_pool_their_calls_and_each_repeat_reads_against_the_pooled_oracle(pool: ModuleType) -> None:
    lucky, unlucky = calls("A", [20.0] * 20), calls("A", [24.0] * 20)
    oracle = pool.pooled([{"calls": lucky, "shift_t": None}, {"calls": unlucky, "shift_t": None}], None, False)
    assert oracle["summary"]["mean_ms"] == pytest.approx(22.0)  # not whichever oracle run came first
    assert oracle["summary"]["vs_oracle"] == 1.0
    assert oracle["summary"]["repeats_vs_oracle"] == pytest.approx([20.0 / 22.0, 24.0 / 22.0])
    shifted = calls("B", [22.0] * 10) + calls("A", [22.0] * 30)  # reaches the new best A after ten
    for i, call in enumerate(shifted):
        call["t"] = i * 0.01
    reps = [{"calls": calls("A", [21.0] * 40), "shift_t": 0.0}, {"calls": shifted, "shift_t": 0.0}]
    run = pool.pooled(reps, oracle["summary"], False)
    assert run["summary"]["mean_ms"] == pytest.approx(21.5)
    assert run["summary"]["vs_oracle"] == pytest.approx(21.5 / 22.0)
    assert run["summary"]["repeats_vs_oracle"] == pytest.approx([21.0 / 22.0, 1.0])
    assert [pool.follow(r["calls"], 0.0) for r in reps] == [0, 6]
    assert run["summary"]["follow_requests"] == 3  # the median of the repeats' own, each from its shift
    assert len(run["calls"]) == 80


def test_follow_counts_requests_until_sixteen_of_twenty_reach_the_new_best(pool: ModuleType) -> None:
    before = calls("A", [20.0] * 10, oracle="A")
    lagging = calls("A", [20.0] * 7, oracle="B")
    following = calls("B", [20.0] * 40, oracle="B")
    run = before + lagging + following
    for i, c in enumerate(run):
        c["t"] = i * 0.01
    shift_t = run[10]["t"]
    assert pool.follow(run, shift_t) == 3  # from the 4th request on, 16 of the next 20 are on B
    assert pool.summarise(run, shift_t)["follow_requests"] == 3


async def test_the_oracle_run_pins_each_request_to_the_scheduled_best(pool: ModuleType, proxy) -> None:
    sim = {"kind": "simulated", "simulate": {"first_chunk_ms": 1, "jitter_ms": 0, "chunk_ms": 0, "chunks": 2}}
    p = await proxy({"providers": {n: sim for n in "ABC"},
                     "routes": {"pool": {"strategy": "ordered",
                                         "targets": [{"provider": n, "model": "sim"} for n in "ABC"]}}})
    # By the schedule B is best, then C from half-way; written order alone would always serve A.
    scenario = {"A": {"first_chunk_ms": 30}, "B": {"first_chunk_ms": 20},
                "C": {"first_chunk_ms": 40, "steps": [{"at": 0.5, "first_chunk_ms": 10}]}}
    span = 0.6
    now = time.monotonic()
    starts = {n: now for n in "ABC"}
    result = await pool.load(f"{p.url}/v1/chat/completions", 3, now + span, starts, scenario, span,
                             f"{p.url}/v1/health", pin=True)
    done = result["calls"]
    assert done and all(c["ok"] for c in done)
    assert all(c["served"] == c["oracle"] for c in done)
    assert {c["served"] for c in done} == {"B", "C"}
    assert pool.summarise(done, None)["choice_vs_sched"] == 1.0
    unpinned = await pool.load(f"{p.url}/v1/chat/completions", 3, time.monotonic() + 0.1, starts, scenario,
                               span, f"{p.url}/v1/health")
    assert {c["served"] for c in unpinned["calls"]} == {"A"}


def test_duplicates_and_the_served_cost_read_the_race(pool: ModuleType) -> None:
    assert pool.extra_calls(()) == 0
    assert pool.extra_calls((("A", "leader"), ("B", "hedge 0.03s"))) == 1
    assert pool.extra_calls((("C", "explore"), ("A", "leader"))) == 1
    assert pool.extra_calls((("B", "budget exhausted"),)) == 0  # due, not paid for: no second call
    k = pool.knobs_at({"first_chunk_ms": 20, "stall_rate": 0.03, "stall_ms": 1500}, 0.0, 1.0)
    assert pool.expected_ms(k) == 20 + 0.03 * 1500  # the oracle ranks a stalling target by its mean
    assert pool.served_ms(k, 25.0, "leader") == 20 and pool.served_ms(k, 1530.0, "") == 1520
    assert pool.served_ms(pool.knobs_at({"first_chunk_ms": 40}, 0.0, 1.0), 80.0, "hedge 0.03s") == 70
    loaded = {"A": {"first_chunk_ms": 15, "load_ms": 8}, "B": {"first_chunk_ms": 40}, "C": {"first_chunk_ms": 60}}
    at = {n: 0.0 for n in "ABC"}
    assert pool.oracle(loaded, at, 1.0) == ("A", 15)
    assert pool.oracle(loaded, at, 1.0, {"A": 3, "B": 0, "C": 0}) == ("A", 39)
    assert pool.oracle(loaded, at, 1.0, {"A": 4, "B": 0, "C": 0}) == ("B", 40)  # the oracle's own load counts


def test_under_load_x_choice_counts_the_calls_still_waiting_at_the_target(pool: ModuleType) -> None:
    scenario = {"A": {"first_chunk_ms": 15, "load_ms": 8}, "B": {"first_chunk_ms": 40}, "C": {"first_chunk_ms": 60}}
    zero = {n: 0.0 for n in "ABC"}
    done = [  # three calls on A begun together, each waiting for its first chunk when the next began
        {"t": 0.000, "ok": True, "served": "A", "attempts": (("A", "200 0.015s"),), "race": ()},
        {"t": 0.001, "ok": True, "served": "A", "attempts": (("A", "200 0.023s"),), "race": ()},
        {"t": 0.002, "ok": True, "served": "A", "attempts": (("A", "200 0.031s"),), "race": ()},
        # later, A idle again: B leads and A's hedge, 0.02 s on, serves; the leader's span is B's
        {"t": 0.100, "ok": True, "served": "A", "attempts": (("B", "lost 0.035s"), ("A", "200 0.015s")),
         "race": (("B", "leader"), ("A", "hedge 0.02s"))},
        {"t": 0.200, "ok": True, "served": "B", "attempts": (("B", "200 0.04s"),), "race": ()},
    ]
    pool.loaded_choice(done, scenario, zero, 10.0)
    assert [c["served_ms"] for c in done] == [15, 23, 31, pytest.approx(15 + 20), 40]
    # Its ratio is to the measured oracle's expected time (its own waiting counted), not to A's idle 15 ms.
    oracle_run = pool.summarise(calls("A", [45.0] * 10, oracle_ms=40.0, served_ms=40.0), None, None, True)
    run = pool.summarise(calls("A", [50.0] * 10, oracle_ms=15.0, served_ms=44.0), None, oracle_run, True)
    assert (oracle_run["choice_vs_sched"], run["choice_vs_sched"]) == (1.0, pytest.approx(44.0 / 40.0))


@pytest.fixture(scope="module")
def direct(pool: ModuleType) -> ModuleType:
    """scripts/pool_direct.py (``simulate-pool --direct``), as the script imports it."""
    return sys.modules["pool_direct"]


async def test_the_direct_client_calls_the_scheduled_best_upstream_itself(direct: ModuleType, upstreams) -> None:
    ups = {n: await upstreams({"/v1/chat/completions": ok_handler()}) for n in "ABC"}
    urls = {n: f"{up.url}/v1/chat/completions" for n, up in ups.items()}
    # By the schedule B is best, then C from half-way; A never.
    scenario = {"A": {"first_chunk_ms": 30}, "B": {"first_chunk_ms": 20},
                "C": {"first_chunk_ms": 40, "steps": [{"at": 0.5, "first_chunk_ms": 10}]}}
    span = 0.6
    now = time.monotonic()
    done = await direct.client(direct.DIRECT, urls, 2, now + span, dict.fromkeys("ABC", now), scenario, span)
    assert done and all(c["ok"] and c["extra"] == 0 for c in done)
    assert all(c["served"] == c["oracle"] for c in done)
    assert {c["oracle"] for c in done} == {"B", "C"}
    assert {n: len(up.calls) for n, up in ups.items()} == {n: sum(c["oracle"] == n for c in done) for n in "ABC"}


async def test_the_floor_relays_each_call_to_the_upstream_its_pin_names(direct: ModuleType, upstreams) -> None:
    """``--strategies floor``: scripts/floor.py ``--pick``, pinned as the oracle is, so what any Python hop costs
    reads beside firstbyte's; each call reaches the scheduled best, and none other."""
    from aiohttp import web

    spec = importlib.util.spec_from_file_location("floor", SCRIPTS / "floor.py")
    assert spec is not None and spec.loader is not None
    floor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(floor)
    ups = {n: await upstreams({"/v1/chat/completions": ok_handler()}) for n in "ABC"}
    runner = web.AppRunner(floor.build("http://127.0.0.1:1", picks={n: up.url for n, up in ups.items()}))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        done = await pinned_calls(direct, direct.FLOOR, runner.addresses[0][1])
    finally:
        await runner.cleanup()
    assert_each_call_reached_its_pin(done, ups)


async def pinned_calls(direct: ModuleType, strategy: str, port: int) -> list[dict]:
    """0.6 s of calls pinned, by ``x-route-provider``, to the scheduled best of B then C (C drops half-way)."""
    scenario = {"A": {"first_chunk_ms": 30}, "B": {"first_chunk_ms": 20},
                "C": {"first_chunk_ms": 40, "steps": [{"at": 0.5, "first_chunk_ms": 10}]}}
    now = time.monotonic()
    return await direct.client(strategy, {"firstbyte": f"http://127.0.0.1:{port}/v1/chat/completions"}, 2,
                               now + 0.6, dict.fromkeys("ABC", now), scenario, 0.6)


def assert_each_call_reached_its_pin(done: list[dict], ups: dict) -> None:
    assert done and all(c["ok"] and c["extra"] == 0 and c["served"] == c["oracle"] for c in done)
    assert {c["oracle"] for c in done} == {"B", "C"}
    assert {n: len(up.calls) for n, up in ups.items()} == {n: sum(c["oracle"] == n for c in done) for n in "ABC"}


async def test_a_proxied_client_keeps_each_calls_route_decision_for_dump_calls(direct: ModuleType, proxy) -> None:
    """``--dump-calls`` reads where a strategy lost time from each call's header, so the client keeps it."""
    sim = {"kind": "simulated", "simulate": {"first_chunk_ms": 1, "jitter_ms": 0, "chunk_ms": 0, "chunks": 2}}
    p = await proxy({"providers": {n: sim for n in "ABC"},
                     "routes": {"pool": {"strategy": "ordered",
                                         "targets": [{"provider": n, "model": "sim"} for n in "ABC"]}}})
    scenario = {n: {"first_chunk_ms": 20} for n in "ABC"}
    now = time.monotonic()
    done = await direct.client("oracle", {"firstbyte": f"{p.url}/v1/chat/completions"}, 2, now + 0.2,
                               dict.fromkeys("ABC", now), scenario, 0.2)
    assert done and all(c["ok"] for c in done)
    assert all(c["header"].startswith("id=") and f"served={c['served']}" in c["header"] for c in done)
    assert direct.parse(["--dump-calls", "--port-base", "47200"]).dump_calls


def test_each_strategy_is_the_shipped_route_with_its_hedge_as_the_reader_takes_it(direct: ModuleType) -> None:
    shipped = direct.shipped_route()
    chat = make_config({"providers": {"p": {"kind": "simulated"}},
                        "routes": {"chat": {"strategy": "fastest", "targets": [{"provider": "p", "model": "m"}],
                                            **shipped}}}).routes["chat"]
    assert shipped["hedge"]["after"] == "p90" and chat.hedge is not None  # routes.yaml races
    providers = {n: {"kind": "openai", "base_url": "http://127.0.0.1:9/v1"} for n in "ABC"}
    config = make_config({"providers": providers, "routes": direct.routes(shipped)})
    assert config.routes["shipped"].hedge == chat.hedge
    assert config.routes["measure"].hedge is not None and config.routes["measure"].hedge.after_secs == 600
    assert config.routes["off"].hedge is None
    assert config.routes["oracle"].strategy == "ordered"
    assert "hedge" not in direct.routes(shipped)["unset"]  # the route says nothing: the reader's default


def direct_calls(ttfc: list[float], served: str = "A", extra: int = 0, t0: float = 0.0) -> list[dict]:
    return [{"t": t0 + i * 0.01, "ok": True, "served": served, "oracle": "A", "oracle_ms": 20.0, "ttfc_ms": ms,
             "extra": extra} for i, ms in enumerate(ttfc)]


@pytest.mark.parametrize(("ttfc", "extra", "x_direct", "dup", "verdict"), [
    pytest.param([21.0] * 10, 0, 21 / 20, 0.0, "met (<= 1.05)", id="at-the-line"),
    pytest.param([22.0] * 10, 0, 22 / 20, 0.0, "MISSED (<= 1.05)", id="too-slow"),
    pytest.param([20.0] * 10, 1, 1.0, 1.0, "MISSED (<= 1.05)", id="every-call-duplicated"),
])
def test_a_strategy_reads_against_the_direct_client_of_the_same_run(
        direct: ModuleType, ttfc: list[float], extra: int, x_direct: float, dup: float, verdict: str) -> None:
    reps = [{"calls": {"direct": direct_calls([20.0] * 10), "shipped": direct_calls(ttfc, extra=extra)},
             "shift_t": None}]
    res = direct.pool(reps, ["direct", "shipped"])
    assert res["pooled"]["shipped"]["x_direct"] == pytest.approx(x_direct)
    assert res["pooled"]["shipped"]["dup_share"] == dup
    assert res["pooled"]["shipped"]["x_sched"] == pytest.approx(statistics.fmean(ttfc) / 20.0)
    assert direct.table({"steady": res}, ["direct", "shipped"])[2].endswith(f"| {verdict} |")


def test_after_the_shift_each_repeat_reads_from_its_own_shift(direct: ModuleType) -> None:
    early = {"direct": direct_calls([20.0] * 10) + direct_calls([20.0] * 10, t0=1.0),
             "unset": direct_calls([20.0] * 10) + direct_calls([60.0] * 10, t0=1.0)}
    late = {"direct": direct_calls([20.0] * 10) + direct_calls([20.0] * 10, t0=2.0),
            "unset": direct_calls([40.0] * 10) + direct_calls([20.0] * 10, t0=2.0)}
    res = direct.pool([{"calls": early, "shift_t": 1.0}, {"calls": late, "shift_t": 2.0}], ["direct", "unset"])
    assert [r["unset"]["x_direct_after"] for r in res["repeats"]] == [3.0, 1.0]
    assert res["pooled"]["unset"]["x_direct_after"] == pytest.approx(2.0)
    assert res["pooled"]["unset"]["x_direct"] == pytest.approx(35.0 / 20.0)
    assert "[1.00-3.00]" in direct.table({"s": res}, ["direct", "unset"])[2]


def test_the_hedge_off_runs_say_hedge_false_since_a_fastest_route_races_by_default(pool: ModuleType) -> None:
    args = argparse.Namespace(explore=None, alpha=None, load_weight=None, hedge_after="p95", max_extra=None,
                              refresh=None)
    assert pool.route_of(args, "fastest-ewma")["hedge"] is False
    assert pool.route_of(args, "fastest-p50")["hedge"] is False
    assert pool.route_of(args, "fastest-hedge")["hedge"] == {"after": "p95"}


async def test_nginx_relays_each_call_to_the_upstream_its_pin_names(direct: ModuleType, upstreams,
                                                                      tmp_path: Path) -> None:
    """``--strategies nginx``: nginx (installed by scripts/test) with an upstream group per target, pinned as
    the floor is by ``x-route-provider``: each call reaches the scheduled best, and none other."""
    import asyncio
    import socket

    ups = {n: await upstreams({"/v1/chat/completions": ok_handler()}) for n in "ABC"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sim_ports = {n: int(up.url.rsplit(":", 1)[1]) for n, up in ups.items()}
    command = direct.nginx_command(tmp_path, "pinned", port, sim_ports)
    proc = await asyncio.create_subprocess_exec(*command)
    try:
        for _ in range(100):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        done = await pinned_calls(direct, direct.NGINX, port)
    finally:
        proc.terminate()
        await proc.wait()
    assert_each_call_reached_its_pin(done, ups)
