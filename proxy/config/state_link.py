"""The ``state:`` section: the fleet's Redis, its name and where its password is.

Validated like the rest of the file (every problem with its path) but kept apart from
``reader.py``: the URL rules are Redis's, not a provider's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .fields import Reader, default, parsed_url, show
from .model import StateLink

__all__ = ["read_state"]

_FLEET = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_KEYS = ("redis", "fleet", "password_env")


def read_state(r: Reader, raw: Any, env: Mapping[str, str]) -> StateLink:
    """``state: {redis: URL, fleet: NAME, password_env: VAR}``; absent, the embedded default."""
    data = r.mapping(raw, "state", _KEYS)
    url = r.string(data, "redis", "state", None)
    fleet = r.string(data, "fleet", "state", default(StateLink, "fleet"))
    password_env = r.string(data, "password_env", "state", None)
    if url is not None:
        problem = _redis_problem(url)
        if problem:  # a URL holding a password is not echoed into the log
            r.problem("state.redis", problem if "password" in problem else f"{problem}, got {show(url)}")
    elif data:
        r.problem("state.redis", "required when state is set (redis://HOST:PORT/DB or rediss://)")
    if fleet is not None and not _FLEET.match(fleet):
        r.problem("state.fleet", f"1-64 letters, digits and . _ - only (it prefixes every key), got {show(fleet)}")
    password = None
    if password_env:
        password = env.get(password_env)
        if not password:
            r.problem("state.password_env", f"environment variable {password_env} is unset or empty")
    return StateLink(redis=url, fleet=fleet or default(StateLink, "fleet"), password_env=password_env,
                     password=password)


def _redis_problem(url: str) -> str | None:
    """What makes ``url`` unusable as the fleet's Redis, or None."""
    if not url.startswith(("redis://", "rediss://")):
        return "must start with redis:// or rediss:// (TLS)"
    parsed = parsed_url(url)
    if isinstance(parsed, str):
        return parsed
    if parsed.password is not None:
        return "must not hold the password (name its environment variable in state.password_env)"
    db = parsed.path.strip("/")
    if db and not db.isdigit():
        return "its path must be a database number (redis://HOST:PORT/0)"
    if parsed.query_string or parsed.fragment:
        return "must not have a query or fragment"
    return None
