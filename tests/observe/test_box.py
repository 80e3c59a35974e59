"""proxy/observe/box.py: the workers' exposition texts merged into the box's, by kind."""

from __future__ import annotations

import pytest

from proxy.observe.box import merge

COUNTER = "# HELP firstbyte_requests_total Finished.\n# TYPE firstbyte_requests_total counter\n"
HIST = "# HELP firstbyte_first_chunk_seconds F.\n# TYPE firstbyte_first_chunk_seconds histogram\n"


def gauge(name: str, value: float, labels: str = "") -> str:
    return f"# HELP {name} G.\n# TYPE {name} gauge\n{name}{labels} {value}\n"


@pytest.mark.parametrize(("texts", "expected"), [
    pytest.param([COUNTER + 'firstbyte_requests_total{route="chat"} 3\n',
                  COUNTER + 'firstbyte_requests_total{route="chat"} 4\n'],
                 COUNTER + 'firstbyte_requests_total{route="chat"} 7\n', id="counters-summed"),
    pytest.param([COUNTER + 'firstbyte_requests_total{route="a"} 3\n',
                  COUNTER + 'firstbyte_requests_total{route="b"} 4\n'],
                 COUNTER + 'firstbyte_requests_total{route="a"} 3\nfirstbyte_requests_total{route="b"} 4\n',
                 id="a-series-one-worker-has"),
    pytest.param([HIST + 'firstbyte_first_chunk_seconds_bucket{le="0.1"} 1\nfirstbyte_first_chunk_seconds_sum 0.05\n'
                  'firstbyte_first_chunk_seconds_count 1\n',
                  HIST + 'firstbyte_first_chunk_seconds_bucket{le="0.1"} 2\nfirstbyte_first_chunk_seconds_sum 0.1\n'
                  'firstbyte_first_chunk_seconds_count 2\n'],
                 HIST + 'firstbyte_first_chunk_seconds_bucket{le="0.1"} 3\n'
                 'firstbyte_first_chunk_seconds_sum 0.15000000000000002\nfirstbyte_first_chunk_seconds_count 3\n',
                 id="histograms-summed"),
    pytest.param([gauge("firstbyte_connections", 2, '{listener="main"}'),
                  gauge("firstbyte_connections", 5, '{listener="main"}')],
                 gauge("firstbyte_connections", 7, '{listener="main"}'), id="open-connections-summed"),
    pytest.param([gauge("firstbyte_breaker_state", 0, '{target="a"}'),
                  gauge("firstbyte_breaker_state", 1, '{target="a"}')],
                 gauge("firstbyte_breaker_state", 1, '{target="a"}'), id="shared-state-gauge-the-largest"),
    pytest.param([gauge("firstbyte_config_last_reload_successful", 1),
                  gauge("firstbyte_config_last_reload_successful", 0)],
                 gauge("firstbyte_config_last_reload_successful", 0), id="a-refused-reload-shows"),
    pytest.param([gauge("firstbyte_fleet_connected", 1), gauge("firstbyte_fleet_connected", 0)],
                 gauge("firstbyte_fleet_connected", 0), id="a-worker-alone-shows"),
])
def test_merge(texts: list[str], expected: str) -> None:
    assert merge(texts) == expected
