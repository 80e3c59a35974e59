"""Typed access to a YAML mapping that records problems, each with its path, instead of raising.

Every value the reader takes goes through :class:`Reader`; a section whose keys are all plain
numbers, strings or flags is read from a table of :class:`Num`, :class:`Text` and :class:`Flag`
by :func:`section`, with the defaults of the dataclass it builds.
"""

from __future__ import annotations

import math
import re
import reprlib
from typing import Any, NamedTuple, TypeVar

from yarl import URL

__all__ = ["Flag", "Num", "Reader", "Text", "default", "fill", "key_of", "listen_problem", "parsed_url", "section",
           "show"]

T = TypeVar("T")

_SHOW = reprlib.Repr()
_SHOW.maxlevel, _SHOW.maxlist, _SHOW.maxdict, _SHOW.maxstring, _SHOW.maxother = 2, 4, 4, 80, 80


def show(value: Any) -> str:
    """A value in a problem message, bounded: an alias bomb or a megabyte string prints a few words."""
    return _SHOW.repr(value)


def parsed_url(url: str) -> URL | str:
    """``url`` parsed, or what makes it no URL: one wording for every address the file holds."""
    try:
        parsed = URL(url)
        parsed.port  # noqa: B018 - a port out of range raises here
    except ValueError as exc:
        return f"is not a URL ({exc})"
    return parsed if parsed.host else "has no host"


_LISTEN = re.compile(r"^(\[[0-9a-fA-F:]+\]|[^:\s]*):(\d{1,5})$")


def listen_problem(value: str) -> str | None:
    """What makes ``value`` no HOST:PORT to listen on (the file's ``listen``, ``serve --listen``), or None.
    A port past 65535 is one: the socket took it modulo 65536 (99999 listened on 34463)."""
    match = _LISTEN.match(value)
    if match is None or int(match.group(2)) > 65535:
        return f"expected HOST:PORT (a port up to 65535), got {show(value)}"
    return None


def key_of(value: Any) -> str:
    """A mapping key as it goes into a problem's path."""
    return value if isinstance(value, str) and len(value) <= 80 else show(value)


def default(cls: type, name: str) -> Any:
    """The default the model writes for ``cls.name``: the reader's defaults are taken from here."""
    return cls.__dataclass_fields__[name].default  # type: ignore[attr-defined]


class Reader:
    """Collects problems as ``path: message`` while values are read."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems

    def problem(self, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message}")

    def mapping(self, value: Any, path: str, allowed: tuple[str, ...]) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.problem(path, f"expected a mapping, got {type(value).__name__}")
            return {}
        for key in value:
            if key not in allowed:
                self.problem(f"{path}.{key_of(key)}", f"unknown key (expected one of: {', '.join(allowed)})")
        return value

    def number(self, data: dict[str, Any], key: str, path: str, default: float | None, *,
               low: float | None = None, high: float | None = None, integer: bool = False) -> Any:
        value = data.get(key)
        if value is None:  # unset, or a bare ``key:`` (YAML null): the default, as a bare section takes its own
            return default
        kind = "a whole number" if integer else "a number"
        if isinstance(value, bool) or not isinstance(value, int | float) or (
            integer and not isinstance(value, int)
        ):
            return self._refuse(f"{path}.{key}", f"expected {kind}, got {show(value)}", default)
        if not math.isfinite(value):
            return self._refuse(f"{path}.{key}", f"expected a finite number, got {show(value)}", default)
        if low is not None and value < low:
            return self._refuse(f"{path}.{key}", f"must be at least {low}, got {show(value)}", default)
        if high is not None and value > high:
            return self._refuse(f"{path}.{key}", f"must be at most {high}, got {show(value)}", default)
        return value

    def string(self, data: dict[str, Any], key: str, path: str, default: str | None,
               choices: tuple[str, ...] | None = None) -> Any:
        value = data.get(key)
        if value is None:  # as in ``number``: a null never reaches the model where it has a default
            return default
        if not isinstance(value, str):
            return self._refuse(f"{path}.{key}", f"expected a string, got {show(value)}", default)
        if choices is not None and value not in choices:
            return self._refuse(f"{path}.{key}", f"must be one of {', '.join(choices)}, got {show(value)}", default)
        return value

    def flag(self, data: dict[str, Any], key: str, path: str, default: bool | None) -> bool:
        """A true/false key; a ``None`` default (left unset: decided by the caller) stays None."""
        value = data.get(key, default)
        if value is None and key not in data:
            return value  # type: ignore[return-value]
        if not isinstance(value, bool):
            return bool(self._refuse(f"{path}.{key}", f"expected true or false, got {value!r}", default))
        return value

    def names(self, data: dict[str, Any], key: str, path: str) -> tuple[str, ...]:
        value = data.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.problem(f"{path}.{key}", "expected a list of target names")
            return ()
        return tuple(value)

    def statuses(self, data: dict[str, Any], key: str, path: str) -> tuple[int, ...]:
        """A list of HTTP error statuses (``fail_over_on: [404, 422]``), each checked on its own path."""
        value = data.get(key) or []
        if not isinstance(value, list):
            self.problem(f"{path}.{key}", f"expected a list of HTTP statuses (400 to 599), got {value!r}")
            return ()
        out: list[int] = []
        for i, status in enumerate(value):
            if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
                self.problem(f"{path}.{key}[{i}]", f"expected an HTTP error status, 400 to 599, got {status!r}")
            else:
                out.append(status)
        return tuple(out)

    def _refuse(self, path: str, message: str, default: Any) -> Any:
        """A bad value is a problem, and the default stands in so reading can go on."""
        self.problem(path, message)
        return default


class Num(NamedTuple):
    low: float | None = None
    high: float | None = None
    integer: bool = False


class Text(NamedTuple):
    choices: tuple[str, ...] | None = None


class Flag(NamedTuple):
    pass


Spec = Num | Text | Flag


def section(r: Reader, cls: type[T], raw: Any, path: str, spec: dict[str, Spec]) -> T:
    """A section read from its table: only the table's keys, each with the model's default."""
    return fill(r, cls, r.mapping(raw, path, tuple(spec)), path, spec)


def fill(r: Reader, cls: type[T], data: dict[str, Any], path: str, spec: dict[str, Spec]) -> T:
    """``section`` for a mapping already checked (where its unknown keys must be reported first)."""
    values: dict[str, Any] = {}
    for key, kind in spec.items():
        fallback = default(cls, key)
        if isinstance(kind, Num):
            values[key] = r.number(data, key, path, fallback, low=kind.low, high=kind.high, integer=kind.integer)
        elif isinstance(kind, Text):
            values[key] = r.string(data, key, path, fallback, kind.choices)
        else:
            values[key] = r.flag(data, key, path, fallback)
    return cls(**values)
