"""The config in force as operators see it: when it was taken, and what the reloads since start did.

The gateway stamps ``at`` whenever it adopts a config; the service tells each SIGHUP reload's result.
``/metrics`` (``firstbyte_config_last_reload_successful``, ``firstbyte_config_reloads_total``), the
status page and ``/v1/models`` read it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

__all__ = ["Loaded"]


@dataclass(slots=True)
class Loaded:
    at: float = field(default_factory=time.time)  # when the config in force was taken (epoch seconds)
    ok: bool = True  # the last load was taken (False after a refused reload)
    counts: dict[str, int] = field(default_factory=lambda: {"taken": 0, "refused": 0})  # reloads by result

    def taken(self) -> None:
        """A reload was adopted."""
        self.ok = True
        self.counts["taken"] += 1

    def refused(self) -> None:
        """A reload was refused: the running config stays."""
        self.ok = False
        self.counts["refused"] += 1
