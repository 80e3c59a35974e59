"""The fleet: instances that learn together through Redis (docs/adr/0016).

``link`` keeps the connection and moves events, ``wire`` is their travelling form, ``fold``
applies a peer's events to the local state, ``probes`` claims the fleet's one half-open probe, ``names``
says who this process is in the fleet.
"""

from __future__ import annotations

from .link import FleetLink
from .names import instance_name

__all__ = ["FleetLink", "instance_name"]
