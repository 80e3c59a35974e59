"""The ``tracing:`` section: every problem named with its path."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.config import Tracing, parse_config
from proxy.errors import ConfigError

BASE: dict[str, Any] = {"providers": {"sim": {"kind": "simulated"}},
                        "routes": {"chat": {"targets": [{"provider": "sim", "model": "m"}]}}}


def with_tracing(tracing: Any) -> dict[str, Any]:
    return {**BASE, "tracing": tracing}


def test_absent_is_off() -> None:
    assert parse_config(dict(BASE), {}).tracing is None


def test_a_collector_url_turns_it_on_with_defaults() -> None:
    config = parse_config(with_tracing({"otlp": "http://127.0.0.1:4318/v1/traces"}), {})
    assert config.tracing == Tracing(otlp="http://127.0.0.1:4318/v1/traces", sample=0.1, service_name="firstbyte",
                                     queue=2048)


@pytest.mark.parametrize(("tracing", "problem"), [
    pytest.param({}, "tracing.otlp: required: the collector's OTLP/HTTP traces URL", id="no-url"),
    pytest.param({"otlp": "grpc://collector:4317"}, "tracing.otlp: must start with http:// or https://",
                 id="grpc-scheme"),
    pytest.param({"otlp": "http://:4318/v1/traces"}, "tracing.otlp: is not a URL", id="no-host"),
    pytest.param({"otlp": "http://c:4318", "sample": 1.5}, "tracing.sample: must be at most 1", id="sample-over-one"),
    pytest.param({"otlp": "http://c:4318", "queue": 0}, "tracing.queue: must be at least 1", id="empty-queue"),
    pytest.param({"otlp": "http://c:4318", "export_every": 0}, "tracing.export_every: must be at least 0.01",
                 id="export-every-zero"),
    pytest.param({"otlp": "http://c:4318", "endpoint": "x"}, "tracing.endpoint: unknown key", id="unknown-key"),
    pytest.param({"otlp": "http://c:4318", "service_name": ""}, "tracing.service_name: must not be empty",
                 id="empty-service-name"),
    pytest.param("http://c:4318", "tracing: expected a mapping, got str", id="a-bare-url"),
])
def test_a_bad_section_is_refused_with_its_path(tracing: Any, problem: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(with_tracing(tracing), {})
    assert problem in str(raised.value)
