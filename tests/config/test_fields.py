"""config/fields.py: sections read from a table, with the model's defaults and every problem's path."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.config import Cooldown, Fastest, Timeouts
from proxy.config.fields import Flag, Num, Reader, Spec, Text, default, section

SPEC: dict[str, Spec] = {"signal": Text(("ewma", "p50")), "alpha": Num(low=0.001, high=1),
                         "window": Num(low=1, integer=True), "load_aware": Flag()}


@pytest.mark.parametrize(
    ("raw", "changed", "problems"),
    [
        pytest.param(None, {}, [], id="absent-section-is-all-defaults"),
        pytest.param({"alpha": 0.5}, {"alpha": 0.5}, [], id="a-value-given"),
        pytest.param({"alpha": 2}, {}, ["r.alpha: must be at most 1, got 2"], id="out-of-bounds-keeps-default"),
        pytest.param({"window": 1.5}, {}, ["r.window: expected a whole number, got 1.5"], id="not-whole"),
        pytest.param({"signal": "p99"}, {}, ["r.signal: must be one of ewma, p50, got 'p99'"], id="not-a-choice"),
        pytest.param({"load_aware": "yes"}, {}, ["r.load_aware: expected true or false, got 'yes'"], id="not-a-flag"),
        pytest.param({"seed": 1}, {}, ["r.seed: unknown key (expected one of: signal, alpha, window, load_aware)"],
                     id="key-outside-the-table"),
        pytest.param([1], {}, ["r: expected a mapping, got list"], id="not-a-mapping"),
    ],
)
def test_section(raw: Any, changed: dict[str, Any], problems: list[str]) -> None:
    found: list[str] = []
    got = section(Reader(found), Fastest, raw, "r", SPEC)
    assert got == Fastest(**changed)
    assert found == problems


@pytest.mark.parametrize(
    ("cls", "name", "value"),
    [
        pytest.param(Fastest, "alpha", 0.1, id="fastest-alpha"),
        pytest.param(Cooldown, "failures", 3, id="cooldown-failures"),
        pytest.param(Timeouts, "first_chunk", 30.0, id="timeouts-first-chunk"),
        pytest.param(Fastest, "seed", None, id="none-default"),
    ],
)
def test_default_is_the_models(cls: type, name: str, value: Any) -> None:
    assert default(cls, name) == value
