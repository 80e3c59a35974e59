"""What one call cost: its token counts times the served target's declared price, on its Decision.

Prices are USD per million tokens (``config.Price``); a target without a declared price has no
cost, never a guessed one. The counts come from ``translate/usage.py``; the priced Decision goes
to the observers (access log, metrics, ledger), and the ledger's mean cost per call comes back to
the score strategy through ``State.costs``.
"""

from __future__ import annotations

from typing import Any

from ..config import Price
from .decision import Decision

__all__ = ["cost_of", "priced"]


def cost_of(usage: dict[str, int] | None, price: Price | None) -> float | None:
    """USD for one call; None when either the counts or the price is unknown."""
    if not usage or price is None:
        return None
    return (usage.get("prompt_tokens", 0) * price.input + usage.get("completion_tokens", 0) * price.output) / 1e6


def priced(decision: Decision, price: Price | None, usage: dict[str, int] | None, **changes: Any) -> Decision:
    """The decision with the served call's token counts and cost on it (and any other ``changes``),
    for the observers; ``usage`` is the caller's to give away."""
    if usage:
        changes["usage"] = usage
        changes["cost_usd"] = cost_of(usage, price)
    return decision.but(**changes) if changes else decision
