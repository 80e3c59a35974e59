"""routes.yaml: parse once, validate everything, then trust.

``model`` holds the frozen records and their defaults, ``reader`` validates a document into them
(every problem with its path), ``document`` refuses YAML that should not be read at all. The
names are re-exported here: ``from proxy.config import Route`` is how the rest of firstbyte asks.
"""

from __future__ import annotations

from . import model
from .document import read_yaml
from .model import *  # noqa: F403 - the records are the package's face; model.__all__ names them
from .reader import load_config, parse_config

__all__ = [*model.__all__, "load_config", "parse_config", "read_yaml"]
