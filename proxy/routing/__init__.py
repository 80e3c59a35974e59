"""The routing core: pure functions of config, a state snapshot, a clock and a generator.

Nothing in this package does I/O or imports aiohttp: eligibility subtracts,
ordering ranks, and the Decision records why.
"""
