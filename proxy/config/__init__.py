"""routes.yaml: parse once, validate everything, then trust.

``model`` holds the frozen records and their defaults, ``reader`` validates a document into them
(every problem with its path), ``document`` refuses YAML that should not be read at all. The
names are re-exported here: ``from proxy.config import Route`` is how the rest of firstbyte asks.
"""

from __future__ import annotations

from .document import read_yaml
from .model import (
    AZURE_API_VERSION,
    DEFAULT_STRATEGY,
    KINDS,
    SIGNALS,
    STRATEGIES,
    AccessLog,
    Clients,
    Config,
    Connections,
    Cooldown,
    Fastest,
    Hedge,
    Ledger,
    Price,
    Provider,
    Route,
    ScoreWeights,
    Simulate,
    Target,
    TargetKey,
    Timeouts,
    split_listen,
)
from .reader import load_config, parse_config

__all__ = [
    "AZURE_API_VERSION",
    "DEFAULT_STRATEGY",
    "KINDS",
    "SIGNALS",
    "STRATEGIES",
    "AccessLog",
    "Clients",
    "Config",
    "Connections",
    "Cooldown",
    "Fastest",
    "Hedge",
    "Ledger",
    "Price",
    "Provider",
    "Route",
    "ScoreWeights",
    "Simulate",
    "Target",
    "TargetKey",
    "Timeouts",
    "load_config",
    "parse_config",
    "read_yaml",
    "split_listen",
]
