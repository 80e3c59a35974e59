"""Who this process is in the fleet: the name its entries, log lines and ledger rows carry."""

from __future__ import annotations

import itertools
import os
import socket

__all__ = ["instance_name", "link_name"]

_NAMES: dict[int, str] = {}  # pid -> this process's name (a forked worker gets its own)
_LINKS = itertools.count()


def instance_name() -> str:
    """Who this process is in the fleet, in its log lines and its ledger rows: host and pid (or
    ``FIRSTBYTE_INSTANCE``, a pod's name) and a few random digits, new at each start (a restart is
    another instance: it folds in what its previous life published)."""
    pid = os.getpid()
    name = _NAMES.get(pid)
    if name is None:
        base = os.environ.get("FIRSTBYTE_INSTANCE") or f"{socket.gethostname()}-{pid}"
        name = _NAMES[pid] = f"{base}-{os.urandom(2).hex()}"
    return name


def link_name() -> str:
    """The process's name for its first link; a second gateway in one process (tests) is another."""
    n = next(_LINKS)
    return instance_name() if n == 0 else f"{instance_name()}-{n}"
