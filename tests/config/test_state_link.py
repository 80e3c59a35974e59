"""The ``state:`` section: the fleet's Redis, validated with path-named problems, never echoing a password."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.config import StateLink
from proxy.errors import ConfigError

from ..conftest import make_config

BASE = {"providers": {"a": {"kind": "simulated"}}, "routes": {"r": {"targets": [{"provider": "a", "model": "m"}]}}}


@pytest.mark.parametrize(("state", "env", "want"), [
    pytest.param(None, {}, StateLink(), id="absent-embedded-default"),
    pytest.param({"redis": "redis://10.0.0.5:6379/2", "fleet": "prod"}, {},
                 StateLink("redis://10.0.0.5:6379/2", "prod"), id="plain"),
    pytest.param({"redis": "rediss://cache.internal:6380", "password_env": "PW"}, {"PW": "s3cret"},
                 StateLink("rediss://cache.internal:6380", "firstbyte", "PW", "s3cret"), id="tls-and-password"),
])
def test_a_valid_state_section(state: Any, env: dict[str, str], want: StateLink) -> None:
    raw = BASE if state is None else {**BASE, "state": state}
    got = make_config(raw, env).state
    assert (got.redis, got.fleet, got.password_env, got.password) == (want.redis, want.fleet, want.password_env,
                                                                      want.password)


@pytest.mark.parametrize(("state", "problem"), [
    pytest.param({"redis": "http://h:1"}, "state.redis: must start with redis:// or rediss:// (TLS), got 'http://h:1'",
                 id="not-redis"),
    pytest.param({"redis": "redis://:hunter2@h:1"},
                 "state.redis: must not hold the password (name its environment variable in state.password_env)",
                 id="password-in-url-not-echoed"),
    pytest.param({"redis": "redis://h:1/x"}, "state.redis: its path must be a database number", id="bad-db"),
    pytest.param({"fleet": "prod"}, "state.redis: required when state is set", id="no-url"),
    pytest.param({"redis": "redis://h:1", "fleet": "a b"}, "state.fleet: 1-64 letters, digits and . _ - only",
                 id="fleet-name"),
    pytest.param({"redis": "redis://h:1", "password_env": "NOPE"},
                 "state.password_env: environment variable NOPE is unset or empty", id="unset-password"),
    pytest.param({"redis": "redis://h:1", "db": 1}, "state.db: unknown key", id="unknown-key"),
])
def test_a_bad_state_section_names_its_path(state: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        make_config({**BASE, "state": state}, {})
    text = str(caught.value)
    assert problem in text and "hunter2" not in text
