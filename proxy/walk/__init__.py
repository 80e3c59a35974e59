"""The only upstream I/O: the walker, the race, the transports, the deadlines, and classification.

``server`` hands a planned Decision to :func:`walk.race.walk_route`; what comes back is committed
(a Lease to relay) or a verdict to render. State is fed from here and nowhere else.
"""
