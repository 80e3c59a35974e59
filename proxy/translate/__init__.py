"""Dialect translation: one API's requests, answers and streams in another's shape, and the stream readers.

Pure functions and sans-I/O stream translators (``<from>_to_<to>.py``), the first-token gate that
says where a stream commits (``first_token.py``), the usage taps that count a stream passing as it
is, SSE framing, and token counts. Nothing here dials or awaits; the adapters in ``providers/``
put these together per provider kind.
"""
