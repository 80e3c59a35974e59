"""contrib/: the Prometheus alert rules under promtool (each alert fires on synthetic series in
contrib/prometheus/alerts_test.yml), and the Grafana dashboard's queries against the series
firstbyte exports (no panel may query a series that does not exist) and PromQL's grammar.

Without ``promtool`` these tests fail (scripts/test installs Debian's ``prometheus`` package as
root) unless FIRSTBYTE_NO_PROMTOOL=1 says the box cannot have it.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml
from aioprometheus import Histogram

from proxy.observe.metrics import Metrics

from .conftest import promtool

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "contrib" / "prometheus"
DASHBOARD = ROOT / "contrib" / "grafana" / "firstbyte.json"
ALERTS = {"FirstbyteBreakerOpenLong", "FirstbyteRouteNoHealthyTarget", "FirstbyteFailoverShareHigh",
          "FirstbyteHedgeBudgetExhausted", "FirstbyteReloadRefused", "FirstbyteLedgerDroppingRows"}


def run(*args: str, cwd: Path = RULES) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def exported() -> set[str]:
    """Every series name firstbyte's /metrics can hold (a histogram's three)."""
    names = set()
    for name, collector in Metrics().registry.collectors.items():
        if isinstance(collector, Histogram):
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        else:
            names.add(name)
    return names


def queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel.get("targets", ())]


def test_the_alert_rules_are_valid_and_each_fires_in_its_test() -> None:
    tool = promtool()
    assert "SUCCESS: 6 rules found" in run(tool, "check", "rules", "alerts.yml")
    run(tool, "test", "rules", "alerts_test.yml")
    rules = yaml.safe_load((RULES / "alerts.yml").read_text())["groups"][0]["rules"]
    assert {r["alert"] for r in rules} == ALERTS
    tested = yaml.safe_load((RULES / "alerts_test.yml").read_text())["tests"]
    fired = {t["alertname"] for case in tested for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert fired == ALERTS  # every alert has a case where it fires


def test_the_alert_rules_query_only_exported_series() -> None:
    rules = yaml.safe_load((RULES / "alerts.yml").read_text())["groups"][0]["rules"]
    used = {name for r in rules for name in re.findall(r"\bfirstbyte_[a-z_]+\b", r["expr"])}
    assert used and used <= exported(), used - exported()


def test_every_dashboard_query_reads_a_series_firstbyte_exports() -> None:
    names = exported()
    found = queries()
    assert len(found) >= 20
    for title, expr in found:
        used = set(re.findall(r"\bfirstbyte_[a-z_]+\b", expr))
        assert used, f"panel {title!r} queries no firstbyte series: {expr}"
        assert used <= names, f"panel {title!r} queries {sorted(used - names)}, which firstbyte does not export"
    # what the issue asks the dashboard to show, each in some panel
    everything = " ".join(expr for _, expr in found)
    for series in ("firstbyte_requests_total", "firstbyte_target_latency_seconds", "firstbyte_failovers_total",
                   "firstbyte_breaker_state", "firstbyte_races_won_total", "firstbyte_duplicate_calls_total",
                   "firstbyte_hedge_budget_exhausted_total", "firstbyte_connections",
                   "firstbyte_client_first_byte_seconds_bucket", "firstbyte_client_duration_seconds_bucket"):
        assert series in everything, f"no panel shows {series}"


def test_every_dashboard_query_is_promql(tmp_path: Path) -> None:
    """promtool checks each query as a recording rule, with Grafana's variables filled in."""
    tool = promtool()
    rules: list[dict[str, Any]] = []
    for i, (_, expr) in enumerate(queries()):
        filled = expr.replace("$__rate_interval", "5m").replace("$instance", ".*")
        rules.append({"record": f"firstbyte:dashboard_query_{i}", "expr": filled})
    (tmp_path / "queries.yml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    assert f"SUCCESS: {len(rules)} rules found" in run(tool, "check", "rules", "queries.yml", cwd=tmp_path)
