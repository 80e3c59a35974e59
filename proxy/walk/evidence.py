"""What a racer that ended without a token says of its target: a lower bound of its first token.

A racer cancelled because another won (a lost race), or a measuring loser cut at its cap, had no
first token by then: its time so far is a censored sample. It goes to the state's one door
(``State.censored``); the tracker holds one and demotes on two in a row (docs/adr/0022). A bound
under the target's own figure says nothing its figure does not, so it is not told: a hedge that
started 10 ms before the leader answered is no evidence against the hedge's 100 ms figure. Nor is
an unmeasured target's lost race told: it is owed a measure of its own (``state/budget.py``), and a
bound as short as the winner's time would make it measured and hide it. A measure cut at its cap
(``capped``) is told: it ran several times the winner's time, which ranks it behind.

A leader still without a token at its hedge delay whose hedge the budget refused (``overdue``) is
the same evidence, told at that moment rather than when the race is lost: its time so far, held
behind the target the hedge would have started (docs/adr/0023, "An overdue leader"). A hedge the budget paid
for tells it when the race ends instead (won or lost), so one call tells one bound at most. Not in a
route's cold start (``HedgeBudget.earned``): there every hedge is refused for the start's advances, the
hedge delay is the most of a few samples and the hedge's figure one measure, so a box's stall on two
calls demoted the leader (docs/adr/0023, "Not in the cold start").
"""

from __future__ import annotations

from ..config import Fastest, Target
from ..routing.ordering import fastest_figures
from ..state import State
from ..state.budget import HedgeBudget
from ..state.tracker import BUFFERED, STREAMED


def lower_bound(state: State, policy: Fastest, stream: bool, target: Target, started: float, now: float,
                winner: Target | None = None, capped: bool = False) -> bool | None:
    """Tell the state that ``target`` had no first token since ``started``, behind ``winner``: True
    when that demoted it (two bounds in a row, ``state/tracker.py``), False when it is held, None when
    nothing was told."""
    mode = STREAMED if stream else BUFFERED
    key, elapsed = target.key, now - started
    figure = state.figure(key, policy, now, mode)
    if (figure is None and not capped) or (figure is not None and elapsed <= figure):
        return None
    # The winner's figure as ``fastest`` ranks it (a recovery's fast EWMA, not its stale average):
    # the loser goes behind where the order puts the winner, not behind an old paper figure.
    behind = None if winner is None else fastest_figures([winner], state, policy, now, mode)[winner.name]
    return state.censored(state.target(key), elapsed, now, mode, behind)


def overdue(state: State, policy: Fastest, stream: bool, leader: Target, started: float, now: float,
            hedge: Target, budget: HedgeBudget) -> bool | None:
    """``leader``, begun at ``started``, is past its hedge delay and ``budget`` refused ``hedge``:
    its time so far is a lower bound, held behind ``hedge``'s figure. Not told while ``hedge`` is
    unmeasured (nothing to rank behind: it is owed a measure of its own), nor before the route has
    earned a token (a cold start's refusals). As ``lower_bound``: True when it demoted, None when
    nothing was told (then the call may still tell a lost race)."""
    mode = STREAMED if stream else BUFFERED
    if not budget.earned:
        return None
    if fastest_figures([hedge], state, policy, now, mode)[hedge.name] is None:
        return None
    return lower_bound(state, policy, stream, leader, started, now, hedge)
