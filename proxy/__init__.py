"""firstbyte: an OpenAI-compatible LLM gateway that routes to the fastest healthy provider.

The public surface is small on purpose: the decision header parser (for ops tools
and tests), the config loader, and the records a decision is made of.
"""

from __future__ import annotations

from .config import Config, load_config, parse_config
from .errors import ClientError, ConfigError, FirstbyteError
from .routing.decision import (
    Attempt,
    Decision,
    Excluded,
    HeaderError,
    ParsedDecision,
    Ranked,
    format_header,
    parse_header,
)

__version__ = "0.1.0"

__all__ = [
    "Attempt",
    "ClientError",
    "Config",
    "ConfigError",
    "Decision",
    "Excluded",
    "FirstbyteError",
    "HeaderError",
    "ParsedDecision",
    "Ranked",
    "format_header",
    "load_config",
    "parse_config",
    "parse_header",
]
