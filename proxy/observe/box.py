"""One ``/metrics`` for a box of workers: each worker's exposition text, merged into one.

The worker a scrape reaches asks every worker (itself included) for its own text over the
workers' private Unix sockets and merges them here: counters and histograms are summed, as are
the gauges that count things each worker holds (connections open); a gauge every worker reads
from the shared fleet state (a figure, a breaker, in-flight calls, healthy targets) is the same
figure everywhere and is given once (the largest); a yes/no gauge (the last reload taken, in the
fleet) is the least, so one worker that refused a reload or is alone shows.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["merge"]

_LEAST = frozenset({"firstbyte_config_last_reload_successful", "firstbyte_fleet_connected"})
_SUMMED_GAUGES = frozenset({"firstbyte_connections"})


def _family(sample: str, families: dict[str, str]) -> str:
    """The family a sample belongs to (a histogram's ``_bucket``/``_sum``/``_count`` are its family's)."""
    name = sample.split("{", 1)[0]
    if name in families:
        return name
    for suffix in ("_bucket", "_sum", "_count", "_total", "_created"):
        if name.endswith(suffix) and name[: -len(suffix)] in families:
            return name[: -len(suffix)]
    return name


def _combine(kind: str, family: str, values: list[float]) -> float:
    if kind != "gauge" or family in _SUMMED_GAUGES:
        return sum(values)
    return min(values) if family in _LEAST else max(values)


def merge(texts: Iterable[str]) -> str:
    """The text exposition of the whole box, families in the order the first worker lists them."""
    heads: dict[str, list[str]] = {}  # family: its HELP and TYPE lines
    kinds: dict[str, str] = {}
    samples: dict[str, dict[str, list[float]]] = {}  # family: series (name and labels): values
    for text in texts:
        for line in text.splitlines():
            if line.startswith("# "):
                parts = line.split(" ", 3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    family = parts[2]
                    head = heads.setdefault(family, [])
                    if not any(h.startswith(f"# {parts[1]} ") for h in head):
                        head.append(line)
                    if parts[1] == "TYPE":
                        kinds[family] = parts[3] if len(parts) > 3 else "untyped"
                    samples.setdefault(family, {})
                continue
            if not line.strip():
                continue
            series, _, value = line.rpartition(" ")
            family = _family(series, kinds)
            samples.setdefault(family, {}).setdefault(series, []).append(float(value))
    out: list[str] = []
    for family, members in samples.items():
        out.extend(heads.get(family, []))
        kind = kinds.get(family, "untyped")
        for name, values in members.items():
            out.append(f"{name} {_format(_combine(kind, family, values))}")
    return "\n".join(out) + "\n"


def _format(value: float) -> str:
    return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)
