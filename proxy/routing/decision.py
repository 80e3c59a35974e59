"""The Decision record and its one-line form, the ``x-route-decision`` header.

The planner produces a Decision without attempts; the walker returns a finished
copy with its attempts and the served target. Observers (access log, metrics,
ledger) only read it. The header grammar is fixed by DESIGN.md::

    id=7f3a9c; route=chat; strategy=fastest; order=groq(fastest 0.31s), openai(0.82s);
    excluded=local(breaker open 12s); attempts=groq(503 0.04s), openai(200 0.79s); served=openai

A request that raced (docs/adr/0008) also carries ``race=``: each racer with why it
ran (``leader``, ``hedge 0.40s``, ``explore``, ``measure``, or ``budget exhausted`` for a
hedge that was due but not paid for), in the order they started. A loser's attempt reads ``lost``,
``measuring`` (still running to its own first token at the commit), ``measured`` or ``capped``.

Fields with no items (``excluded``, ``attempts``, ``race``, ``served``) are left out, so the
parser treats a missing field as empty.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = [
    "Attempt",
    "Decision",
    "Excluded",
    "HeaderError",
    "ParsedDecision",
    "Racer",
    "Ranked",
    "duplicate_calls",
    "format_attempts",
    "format_excluded",
    "format_header",
    "format_order",
    "header_with",
    "parse_header",
]

HEADER = "x-route-decision"

# The small records are NamedTuples: immutable like the frozen dataclasses, and built
# several times per request, where a frozen dataclass's __init__ costs three to four times as much.


# How a Ranked figure reads in the header: seconds (``0.31s``, ``unmeasured``), a declared price
# (``2/M``, ``no price``) or a score total (``0.71``).
SECONDS = "s"
PRICE = "/M"
TOTAL = ""


# A racer's end, not a failure: ``lost`` (cut when another committed, or the client left),
# ``measuring`` (an explored loser still running to its own first token), ``measured`` (it got
# there), ``capped`` (cut at its cap first).
RACE_WORDS = frozenset({"lost", "measuring", "measured", "capped"})
# Attempts that are no failover: a racer's end, and a request no call was made for (the
# request, not the target, could not go there: counting it would inflate the failover rate).
NOT_MOVED_PAST = RACE_WORDS | {"untranslatable"}


class Ranked(NamedTuple):
    """One candidate in the order: the word that put it first (``reason``; None behind the first)
    and the figure it was ranked by. Only the header writer turns them into text (``fastest 0.31s``),
    so nothing downstream parses a reason back out of a string."""

    name: str
    reason: str | None = None
    figure: float | None = None
    unit: str = SECONDS
    signal: str | None = None  # score: the signal whose lead put the first first

    @property
    def detail(self) -> str:
        """The item's text in the header: ``fastest 0.31s``, ``0.82s``, ``cheapest 2/M``…"""
        return _detail(self)


class Excluded(NamedTuple):
    """A target eligibility removed, with the one reason that removed it."""

    name: str
    reason: str


class Attempt(NamedTuple):
    """One upstream try: ``outcome`` is a status code or a failure word (reset, timeout, busy)."""

    name: str
    outcome: str
    seconds: float
    failover: bool = False  # the walk moved on (failover-safe); busy and cooldown skips do not count
    ttfc: float | None = None  # time to first chunk when the upstream answered 2xx


class Racer(NamedTuple):
    """A target that ran side by side with others, and why: ``leader``, ``hedge 0.40s``…"""

    name: str
    role: str


@dataclass(frozen=True, slots=True)
class Decision:
    """Why a request went where it went; the same record feeds header, log, metrics, ledger."""

    id: str
    route: str
    strategy: str
    order: tuple[Ranked, ...]
    excluded: tuple[Excluded, ...] = ()
    attempts: tuple[Attempt, ...] = ()
    served: str | None = None
    status: int | None = None
    usage: dict[str, int] = field(default_factory=dict)
    cost_usd: float | None = None
    race: tuple[Racer, ...] = ()
    _header: str | None = field(default=None, compare=False, repr=False)
    _planned: str | None = field(default=None, compare=False, repr=False)  # see planned_fields

    @property
    def first_reason(self) -> str:
        """The word that put the first target first (``fastest``, ``explore``…), or ``none``."""
        reason = self.order[0].reason if self.order else None
        return reason.split(" ", 1)[0] if reason else "none"

    @property
    def failovers(self) -> int:
        """Targets moved past before one answered (retries on one target, and targets the request
        could not be translated for, do not count). Attempts
        are in the order they started: only those before the served target's first attempt were
        moved past; a racer that lost to it, or failed while it already ran, was not."""
        if len(self.attempts) < 2:
            return 0
        served = self.served
        moved: list[str] = []
        for attempt in self.attempts:
            name = attempt.name
            if name == served:
                return len(moved)
            if attempt.outcome not in NOT_MOVED_PAST and name not in moved:
                moved.append(name)
        return max(0, len(moved) - 1)  # nobody served: the last one tried was not moved past

    def as_tried(self, race: Sequence[Racer]) -> Decision:
        """The order as the walk took it. A first that would have raced (explored, or measured
        while unmeasured) but that the budget refused waited behind the next target, which led:
        the header then says so, rather than naming a first that never went first."""
        order = self.order
        if len(order) < 2 or not race or race[0] != (order[0].name, "budget exhausted"):
            return self
        waited, lead = order[0], order[1]
        first = lead._replace(reason="unmeasured" if lead.figure is None else "fastest")
        return self.but(order=(first, waited._replace(reason=None), *order[2:]))

    def header(self) -> str:
        """The ``x-route-decision`` value, formatted once per record (the response and the log both ask)."""
        if self._header is None:
            object.__setattr__(self, "_header", header_with(self, self.attempts, self.served, self.race))
        return self._header  # type: ignore[return-value]

    def planned_fields(self) -> str:
        """The header's fields the plan fixed (``id`` to ``excluded``), formatted once: a stream's
        header is finished at its first token, and the server has this part formatted while the
        upstream thinks (``server/app.py``), so the first token does not wait for it."""
        if self._planned is None:
            text = (f"id={self.id}; route={self.route}; strategy={self.strategy}; order="
                    + format_order(self.order))
            if self.excluded:
                text += "; excluded=" + format_excluded(self.excluded)
            object.__setattr__(self, "_planned", text)
        return self._planned  # type: ignore[return-value]

    def but(self, **changes: Any) -> Decision:
        """A copy with some fields changed: ``dataclasses.replace`` without its per-call introspection."""
        if "_header" not in changes and not _HEADER_FIELDS.isdisjoint(changes):
            changes["_header"] = None
        get = changes.get
        return Decision(get("id", self.id), get("route", self.route), get("strategy", self.strategy),
                        get("order", self.order), get("excluded", self.excluded), get("attempts", self.attempts),
                        get("served", self.served), get("status", self.status), get("usage", self.usage),
                        get("cost_usd", self.cost_usd), get("race", self.race), get("_header", self._header),
                        None if not _PLANNED_FIELDS.isdisjoint(changes) else self._planned)


def duplicate_calls(race: Sequence[tuple[str, str]]) -> int:
    """Upstream calls a request started beyond one: every racer but one, not a ``budget exhausted``
    (never started). Which racer is the extra one does not matter: an explored racer replaces the
    call the request would have made alone. The metric and scripts/simulate-pool count by this."""
    started = sum(role != "budget exhausted" for _, role in race)
    return started - 1 if started > 1 else 0


_HEADER_FIELDS = frozenset({"id", "route", "strategy", "order", "excluded", "attempts", "served", "race"})
_PLANNED_FIELDS = frozenset({"id", "route", "strategy", "order", "excluded"})


def _detail(r: Ranked) -> str:
    """A first without a figure shows its reason alone (``written``, ``pinned``); behind the first an
    unmeasured target says so. A price always shows, ``no price`` too."""
    if r.unit == SECONDS:
        if r.figure is None:
            return r.reason or "unmeasured"
        figure = f"{r.figure:.2f}s"
    elif r.unit == PRICE:
        figure = "no price" if r.figure is None else f"{r.figure:g}/M"
    else:
        figure = f"{r.figure or 0.0:.2f}"
    if r.signal is not None:
        figure = f"{r.signal} {figure}"
    return figure if r.reason is None else f"{r.reason} {figure}"


# The field values, which the header and the ledger's columns write the same way.
# List comprehensions, not generators, inside join: these run for every request.


def format_order(order: tuple[Ranked, ...]) -> str:
    return ", ".join([f"{r.name}({_detail(r)})" for r in order])


def format_excluded(excluded: tuple[Excluded, ...]) -> str:
    return ", ".join([f"{e.name}({e.reason})" for e in excluded])


def format_attempts(attempts: tuple[Attempt, ...]) -> str:
    return ", ".join([f"{a.name}({a.outcome} {a.seconds:.2f}s)" for a in attempts])


def format_header(decision: Decision) -> str:
    return header_with(decision, decision.attempts, decision.served, decision.race)


def header_with(decision: Decision, attempts: tuple[Attempt, ...], served: str | None,
                race: tuple[Racer, ...] = ()) -> str:
    """The header of ``decision`` once it has these attempts and this served target, without
    building that record yet (a stream's is built when its usage is known, at the end)."""
    text = decision.planned_fields()
    if attempts:
        text += "; attempts=" + format_attempts(attempts)
    if race:
        text += "; race=" + ", ".join([f"{r.name}({r.role})" for r in race])
    if served:
        text += f"; served={served}"
    return text


class HeaderError(ValueError):
    """The header does not follow the grammar."""


@dataclass(frozen=True, slots=True)
class ParsedDecision:
    """The header read back: the same fields as Decision, items as (name, detail) pairs."""

    id: str
    route: str
    strategy: str
    order: tuple[tuple[str, str], ...]
    excluded: tuple[tuple[str, str], ...]
    attempts: tuple[tuple[str, str], ...]
    served: str | None
    race: tuple[tuple[str, str], ...] = ()

    @property
    def order_names(self) -> list[str]:
        return [name for name, _ in self.order]

    @property
    def attempt_names(self) -> list[str]:
        return [name for name, _ in self.attempts]

    @property
    def first_reason(self) -> str:
        return self.order[0][1].split(" ", 1)[0] if self.order else "none"

    def excluded_reason(self, name: str) -> str | None:
        return dict(self.excluded).get(name)

    def attempt_outcomes(self) -> list[tuple[str, str]]:
        """Each attempt as (name, outcome) without its time: ``[("groq", "503")]``."""
        return [(name, detail.rsplit(" ", 1)[0]) for name, detail in self.attempts]


_ITEM = re.compile(r"^([^()]+)\(([^()]*)\)$")
_KEYS = ("id", "route", "strategy", "order", "excluded", "attempts", "race", "served")


def _items(key: str, value: str) -> tuple[tuple[str, str], ...]:
    if not value:
        return ()
    out = []
    for raw in value.split(", "):
        match = _ITEM.match(raw)
        if match is None:
            raise HeaderError(f"{key}: item {raw!r} is not name(detail)")
        out.append((match.group(1), match.group(2)))
    return tuple(out)


def parse_header(value: str) -> ParsedDecision:
    """Read an ``x-route-decision`` value the way ops tools and tests must read it."""
    fields: dict[str, str] = {}
    for part in value.split("; "):
        key, sep, rest = part.partition("=")
        if not sep or key not in _KEYS:
            raise HeaderError(f"unexpected field {part!r}")
        if key in fields:
            raise HeaderError(f"field {key!r} appears twice")
        fields[key] = rest
    for required in ("id", "route", "strategy", "order"):
        if required not in fields:
            raise HeaderError(f"missing field {required!r}")
    return ParsedDecision(
        id=fields["id"],
        route=fields["route"],
        strategy=fields["strategy"],
        order=_items("order", fields["order"]),
        excluded=_items("excluded", fields.get("excluded", "")),
        attempts=_items("attempts", fields.get("attempts", "")),
        served=fields.get("served") or None,
        race=_items("race", fields.get("race", "")),
    )
