"""The walk: the walker, the race, the slot, the lease, the deadlines, and classification.

It carries out what the plan decided, calling upstreams through ``upstream/``'s transports.
``server`` hands a planned Decision to :func:`walk.race.walk_route`; what comes back is one of
``result.py``'s four results: ``Committed`` (a Lease to relay), ``Answered``, ``Rejected`` or
``Exhausted``, each rendered as it is. State is fed from here and nowhere else.
"""
