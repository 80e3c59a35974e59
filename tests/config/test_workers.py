"""``workers:``: a count, ``auto`` for the cores this process may use, and never more than one
without the fleet state the workers share."""

from __future__ import annotations

import os
from typing import Any

import pytest

from proxy.config import parse_config
from proxy.config.workers import MAX_WORKERS
from proxy.errors import ConfigError

REDIS = {"redis": "redis://127.0.0.1:6379/0", "fleet": "box"}
SIM = {"providers": {"s": {"kind": "simulated"}}, "routes": {"chat": {"targets": [{"provider": "s", "model": "m"}]}}}


def workers(extra: dict[str, Any]) -> int | list[str]:
    try:
        return parse_config({**SIM, **extra}, env={}).workers
    except ConfigError as exc:
        return exc.problems


@pytest.mark.parametrize(("extra", "expected"), [
    pytest.param({}, 1, id="default-one-process"),
    pytest.param({"workers": 1}, 1, id="one-needs-no-redis"),
    pytest.param({"workers": 3, "state": REDIS}, 3, id="three-with-redis"),
    pytest.param({"workers": "auto", "state": REDIS}, len(os.sched_getaffinity(0)), id="auto-is-the-affinity"),
    pytest.param({"workers": 0}, [f"workers: expected from 1 to {MAX_WORKERS} (or 'auto': "
                                  f"{len(os.sched_getaffinity(0))} here), got 0"], id="zero"),
    pytest.param({"workers": "many"}, [f"workers: expected a whole number from 1 to {MAX_WORKERS} or 'auto', "
                                       "got 'many'"], id="a-word"),
    pytest.param({"workers": True}, [f"workers: expected a whole number from 1 to {MAX_WORKERS} or 'auto', "
                                     "got True"], id="a-flag"),
    pytest.param({"workers": 2.5}, [f"workers: expected a whole number from 1 to {MAX_WORKERS} or 'auto', "
                                    "got 2.5"], id="a-fraction"),
])
def test_workers_values(extra: dict[str, Any], expected: int | list[str]) -> None:
    assert workers(extra) == expected


def test_more_than_one_worker_without_redis_is_refused_with_what_to_do() -> None:
    problems = workers({"workers": 2})
    assert isinstance(problems, list) and len(problems) == 1
    assert problems[0].startswith("workers: 2 workers need state.redis")
    assert "a local redis-server is enough" in problems[0] and "or workers: 1" in problems[0]
