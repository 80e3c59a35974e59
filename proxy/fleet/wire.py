"""What the fleet's instances tell each other, as it travels through Redis. Pure: no I/O.

A target is named fleet-wide by what it is, not by a file's local name: its provider's address
and the upstream model (``fleet_id``), so two instances whose files name the same upstream
differently share what they learn of it. Times travel as wall-clock seconds (``time.time()``),
never a process's monotonic clock: a receiver turns them back into its own clock, so a skew
between two boxes shifts a deadline by that skew (docs/adr/0016).

A batch is one stream entry: ``{"i": instance, "e": JSON list of events}``. Events carry names,
figures and times only: never a prompt, an answer or a key. An event read with more fields than this
version knows keeps the ones it knows (``decode``): the wire grows at an event's end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson

from ..config import Config, TargetKey

__all__ = ["MAX_BATCH_BYTES", "MAX_EVENTS", "claim_key", "decode", "encode", "fleet_ids", "measure_key", "stream_key"]

Wire = list[Any]  # one event as it travels: [kind, fleet id, ...]
MAX_EVENTS = 512  # events a peer writes in one entry at most (the link's BATCH)
MAX_BATCH_BYTES = 1_000_000  # and their bytes, generously (512 events are ~50 KB; a heartbeat names each target)


def fleet_ids(config: Config) -> dict[TargetKey, str]:
    """Every target's fleet-wide name: ``base_url|model`` (a simulated provider has no address:
    ``simulated:NAME|model``, so simulated twins share only under one name)."""
    out: dict[TargetKey, str] = {}
    for key in config.target_keys():
        provider = config.providers[key[0]]
        where = provider.base_url if provider.kind != "simulated" and provider.base_url else f"simulated:{key[0]}"
        out[key] = f"{where}|{key[1]}"
    return out


def stream_key(fleet: str) -> str:
    return f"firstbyte:{fleet}:events"


def claim_key(fleet: str, fid: str) -> str:
    """The fleet's half-open probe claim of one target (SET NX PX)."""
    return f"firstbyte:{fleet}:probe:{fid}"


def measure_key(fleet: str, fid: str, mode: str) -> str:
    """The fleet's claim to measure one target in one mode (SET NX PX; ``fleet/measures.py``)."""
    return f"firstbyte:{fleet}:measure:{mode}:{fid}"


def encode(events: Iterable[tuple[tuple[Any, ...], float]], fid_of: Mapping[TargetKey, str],
           to_wall: Callable[[float], float]) -> list[Wire]:
    """State events (with the wall time each happened) in their travelling form; monotonic deadlines
    become wall-clock ones. Events of targets the fleet cannot name are left out."""
    out: list[Wire] = []
    for event, at in events:
        kind = event[0]
        if kind == "n":  # this instance's calls in flight per fleet id
            out.append(["n", event[1], at])
            continue
        fid = fid_of.get(event[1])
        if fid is None or kind == "p":
            continue
        if kind in ("s", "c"):
            out.append([kind, fid, event[2], round(event[3], 6), at])
        elif kind == "f":
            out.append(["f", fid, str(event[2]), event[3], event[4]])
        elif kind == "o":
            out.append(["o", fid, to_wall(event[2]), event[3]])
        elif kind == "r":
            out.append(["r", fid, to_wall(event[2])])
    return out


def dumps(wires: list[Wire]) -> bytes:
    return orjson.dumps(wires)


def decode(payload: str | bytes) -> list[Wire]:
    """A batch back into events. An event of a kind this version knows, with at least its fields, is
    kept, cut to them: a later release may add a field at the end of an event (a failure's time, say)
    and peers of this version still fold the fields they know during a rolling deploy (they dropped
    the whole event: every failure, had a field been added). Anything else is dropped: a kind this
    version does not know, an event short of its fields, a batch that is not a list.

    A batch is bounded as a peer writes one: past ``MAX_BATCH_BYTES`` it is dropped unread, and only
    its first ``MAX_EVENTS`` are kept. One entry is folded in one pass (a fold pauses between
    entries, ``backlog.py``): one of 300,000 events, written by anything that can write the stream,
    held every instance's loop for 3.6 s."""
    if len(payload) > MAX_BATCH_BYTES:
        return []
    try:
        events = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return []
    if not isinstance(events, list):
        return []
    out: list[Wire] = []
    for e in events[:MAX_EVENTS]:
        if isinstance(e, list) and e and isinstance(e[0], str) and (arity := _ARITY.get(e[0], 0)) and len(e) >= arity:
            out.append(e if len(e) == arity else e[:arity])
    return out


# Each kind's fields (its own name first). Only ever grow an event at its end, one release after the
# release that reads longer events (this one): no field has been added yet (ADR 0016, "a wire that grows").
_ARITY = {"s": 5, "c": 5, "f": 5, "o": 4, "r": 3, "n": 3}
