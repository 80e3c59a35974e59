"""The ``tracing:`` section: where spans go, checked like every other section.

``tracing: {otlp: http://collector:4318/v1/traces}`` turns traces on. The URL is the
collector's OTLP/HTTP traces endpoint, written whole (no path is added to it). Nothing needs
installing: firstbyte writes the OTLP protobuf itself (``proxy/observe/otlp.py``).
"""

from __future__ import annotations

from typing import Any

from .fields import Num, Reader, Spec, Text, fill, parsed_url
from .model import Tracing

__all__ = ["tracing_section"]

_TRACING: dict[str, Spec] = {"otlp": Text(), "sample": Num(low=0, high=1), "service_name": Text(),
            "queue": Num(low=1, high=1_000_000, integer=True), "export_every": Num(low=0.01, high=60)}


def tracing_section(r: Reader, raw: Any) -> Tracing | None:
    """``tracing`` read and checked; None when the section is absent."""
    if raw is None:
        return None
    data = r.mapping(raw, "tracing", tuple(_TRACING))
    tracing = fill(r, Tracing, data, "tracing", _TRACING)
    if not tracing.otlp:
        r.problem("tracing.otlp", "required: the collector's OTLP/HTTP traces URL "
                  "(for example http://127.0.0.1:4318/v1/traces)")
        return tracing
    problem = _otlp_problem(tracing.otlp)
    if problem is not None:
        r.problem("tracing.otlp", f"{problem}, got {tracing.otlp!r}")
    if not tracing.service_name:
        r.problem("tracing.service_name", "must not be empty")
    return tracing


def _otlp_problem(url: str) -> str | None:
    if not url.startswith(("http://", "https://")):
        return "must start with http:// or https:// (OTLP over HTTP)"
    parsed = parsed_url(url)
    if isinstance(parsed, str):
        return parsed
    return None
