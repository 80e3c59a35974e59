"""What a valid config may still do that its operator did not mean: said by ``firstbyte check``,
logged at start and at a reload, never refused (the file is valid; the box may change under it).

A provider's ``max_concurrent`` is the fleet's, split between its live members (docs/adr/0016): with
fewer places than members, the members ranked past the limit hold no place, and their calls to that
provider fail over at once (503 ``busy`` when the route has nothing else) while the upstream may idle.
``workers: auto`` can bring that about on a bigger box without a change to the file. A split that leaves
some members one place and others two (3 among 2) is said too: the kernel hands connections to
workers unevenly, so a one-place member's second call waits or fails over while a peer has room.
"""

from __future__ import annotations

from .model import Config

__all__ = ["limit_advice", "no_place", "one_place"]


def limit_advice(config: Config, members: int, what: str = "workers") -> list[str]:
    """One warning per provider whose ``max_concurrent`` is below ``members`` (the box's workers), or
    splits unevenly into one or two places each, naming the limit, the members, the routes that use it
    and what to set instead."""
    out = []
    for name, provider in config.providers.items():
        limit = provider.max_concurrent
        if not limit or limit >= 2 * members or limit == members:
            continue
        routes = [r.name for r in config.routes.values() if any(t.provider == name for t in r.targets)]
        used = f" (routes: {', '.join(routes)})" if routes else ""
        out.append(f"providers.{name}.max_concurrent: {limit} is split among {members} {what}{used}; "
                   + (no_place(name, limit, members, what) if limit < members else one_place(name, limit, members)))
    return out


def one_place(provider: str, limit: int, members: int) -> str:
    """An uneven split of one or two places each (``members < limit < 2 * members``), and the remedy."""
    single = 2 * members - limit
    return (f"{single} of them {'holds' if single == 1 else 'hold'} 1 place and the others 2, so a second call "
            f"to {provider} on a one-place member waits or fails over (503 busy when the route has no other "
            f"target) while another may have room; split it evenly: max_concurrent {members} or {2 * members} "
            f"(docs/adr/0016)")


def no_place(provider: str, limit: int, members: int, what: str) -> str:
    """The consequence and the remedy, in words an operator can act on."""
    placeless = members - limit
    return (f"{placeless} of them {'gets' if placeless == 1 else 'get'} no place, so their calls to "
            f"{provider} fail over at once (503 busy when the route has no other target) while the "
            f"upstream may idle; set max_concurrent to at least {members} (the fleet's whole limit, "
            f"split: docs/adr/0016)" + (f", or workers to at most {limit}" if what == "workers" else ""))
