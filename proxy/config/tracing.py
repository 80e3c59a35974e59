"""The ``tracing:`` section: where spans go, checked like every other section.

``tracing: {otlp: http://collector:4318/v1/traces}`` turns traces on. The URL is the
collector's OTLP/HTTP traces endpoint, written whole (no path is added to it). Whether the
``opentelemetry`` packages are installed is checked here too, so a config that asks for
traces on a box without ``firstbyte[otel]`` is refused with the command that fixes it rather
than serving without the traces it was told to send.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from yarl import URL

from .fields import Num, Reader, Spec, Text, fill
from .model import Tracing

__all__ = ["tracing_section"]

_TRACING: dict[str, Spec] = {"otlp": Text(), "sample": Num(low=0, high=1), "service_name": Text(),
            "queue": Num(low=1, high=1_000_000, integer=True)}
_PACKAGES = ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")


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
    if not installed():
        r.problem("tracing", "needs the OpenTelemetry packages: pip install 'firstbyte[otel]'")
    return tracing


def installed() -> bool:
    """The otel extra is importable (checked without importing it: the SDK takes a while to load)."""
    try:
        return all(importlib.util.find_spec(name) is not None for name in _PACKAGES)
    except ModuleNotFoundError:  # a parent package is missing
        return False


def _otlp_problem(url: str) -> str | None:
    if not url.startswith(("http://", "https://")):
        return "must start with http:// or https:// (OTLP over HTTP)"
    try:
        parsed = URL(url)
        parsed.port  # noqa: B018 - a port out of range raises here
    except ValueError as exc:
        return f"is not a URL ({exc})"
    if not parsed.host:
        return "has no host"
    return None
