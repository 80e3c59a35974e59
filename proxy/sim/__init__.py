"""The simulated provider: its model, what it says, and its HTTP server (``firstbyte simulate``).

It serves ``kind: simulated`` in-process and stands in for a real upstream in benchmarks, so its
timing knobs are the ones the routing-quality harness turns.
"""
