"""The ``score`` strategy: rank by a weighted sum of four signals, each in [0, 1].

Pure, like the rest of the planner: it reads the figures, the recent success
share and the measured costs from the state snapshot and never does I/O.

- **speed**: the tracker's figure (time to first chunk), relative.
- **cost**: per call, relative, on one basis per decision: the ledger's measured
  mean cost per call when every priced candidate has one for this operation,
  else the declared price (input + output per million tokens) for all.
- **health**: the share of recent attempts that succeeded.
- **quality**: the declared quality.

A relative signal scores ``g / (g + x)`` against the geometric mean ``g`` of the
measured candidates, with ``x / g`` clamped to a factor of two either way (so
it lies in [1/3, 2/3]); a candidate without data, or the only one with data,
scores the neutral 0.5: nobody is promoted or demoted merely for having history.
The total is the weighted mean of the signals; ties keep the written order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..config import ScoreWeights, Target, TargetKey
from .decision import TOTAL, Ranked

__all__ = ["NEUTRAL", "SIGNALS", "ScoreView", "Scored", "cost_basis", "relative", "score", "score_targets"]

NEUTRAL = 0.5
CLAMP = 2.0  # a relative signal never moves more than a factor of two from the mean
FLOOR = 1e-12  # a free or instant candidate counts as nearly so: the clamp does the rest
SIGNALS = ("speed", "cost", "health", "quality")


class ScoreView(Protocol):
    """What the score strategy reads of the state, besides the figures."""

    @property
    def costs(self) -> Mapping[tuple[str, str], float]:
        """(target name, operation) -> measured mean USD per call."""
        ...

    def success_share(self, key: TargetKey) -> float | None: ...


@dataclass(frozen=True, slots=True)
class Scored:
    """One candidate's signals and total, as explain shows them."""

    target: Target
    speed: float
    cost: float
    health: float
    quality: float
    total: float

    @property
    def signals(self) -> tuple[float, float, float, float]:
        """The four signals in ``SIGNALS`` order, for comparing two candidates signal by signal."""
        return (self.speed, self.cost, self.health, self.quality)


def relative(values: Mapping[str, float | None]) -> dict[str, float]:
    """``g / (g + x)`` per candidate against the geometric mean of the measured ones."""
    measured = {k: max(v, FLOOR) for k, v in values.items() if v is not None}
    if len(measured) < 2:
        return {k: NEUTRAL for k in values}
    g = math.exp(sum(math.log(v) for v in measured.values()) / len(measured))
    out = {}
    for k in values:
        if k not in measured:
            out[k] = NEUTRAL
            continue
        ratio = min(CLAMP, max(1 / CLAMP, measured[k] / g))
        out[k] = 1 / (1 + ratio)
    return out


def cost_basis(
    targets: Sequence[Target], costs: Mapping[tuple[str, str], float], op: str
) -> tuple[str, dict[str, float | None]]:
    """Measured cost per call when every priced candidate has one, else declared prices for all.

    Mixing the two would compare dollars per call with dollars per million tokens.
    """
    priced = [t for t in targets if t.price is not None]
    if priced and all((t.name, op) in costs for t in priced):
        return "measured", {t.name: costs.get((t.name, op)) for t in targets}
    return "declared", {t.name: None if t.price is None else t.price.total for t in targets}


def score_targets(
    weights: ScoreWeights,
    targets: Sequence[Target],
    figures: Mapping[str, float | None],
    state: ScoreView,
    op: str,
) -> tuple[list[Scored], str]:
    """Every candidate's signals and total, best first (ties in written order), and the cost basis."""
    speed = relative({t.name: figures.get(t.name) for t in targets})
    basis, per_call = cost_basis(targets, state.costs, op)
    cost = relative(per_call)
    w = (weights.speed, weights.cost, weights.health, weights.quality)
    total_weight = sum(w)
    scored = []
    for t in targets:
        share = state.success_share(t.key)
        signals = (
            speed[t.name],
            cost[t.name],
            NEUTRAL if share is None else share,
            NEUTRAL if t.quality is None else t.quality,
        )
        total = sum(wi * si for wi, si in zip(w, signals, strict=True)) / total_weight if total_weight else NEUTRAL
        scored.append(Scored(t, *signals, total=total))
    scored.sort(key=lambda s: -s.total)
    return scored, basis


def lead_signal(weights: ScoreWeights, first: Scored, second: Scored | None) -> str:
    """The signal whose weighted lead over the runner-up is largest: what put the first first."""
    if second is None:
        return "only"
    best, gap = "written", 0.0
    w = (weights.speed, weights.cost, weights.health, weights.quality)
    for name, wi, a, b in zip(SIGNALS, w, first.signals, second.signals, strict=True):
        lead = wi * (a - b)
        if lead > gap + 1e-12:
            best, gap = name, lead
    return best


def score(
    weights: ScoreWeights,
    targets: Sequence[Target],
    figures: Mapping[str, float | None],
    state: ScoreView,
    op: str,
) -> tuple[list[Target], list[Ranked]]:
    """The order and the header details: ``score speed 0.71`` first, then each total."""
    scored, _ = score_targets(weights, targets, figures, state, op)
    ranked = []
    for i, s in enumerate(scored):
        if i == 0:
            lead = lead_signal(weights, s, scored[1] if len(scored) > 1 else None)
            ranked.append(Ranked(s.target.name, "score", s.total, TOTAL, lead))
        else:
            ranked.append(Ranked(s.target.name, None, s.total, TOTAL))
    return [s.target for s in scored], ranked
