"""Exceptions and the OpenAI error shape every client-facing error takes.

    FirstbyteError
     ├── ConfigError        a routes file that does not validate (every problem, with its path)
     ├── ClientError        a request we refuse before routing (bad JSON, unknown route, bad pin…)
     └── StreamError        an upstream stream that breaks after commit (an error event, bad framing)
          └── StreamTooLarge  an upstream event past MAX_EVENT_BYTES without its end

Upstream failures are not exceptions here: the walker classifies them into
outcomes (see ``classify.py``), because most of them are expected and routine.
"""

from __future__ import annotations

from typing import Any

import orjson


class FirstbyteError(Exception):
    """Root of the project's exceptions."""


class ConfigError(FirstbyteError):
    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"{source}: {len(problems)} problem(s):\n{lines}")


class StreamError(FirstbyteError):
    """A committed stream the upstream broke; ``partial`` is what was translated before the break."""

    def __init__(self, message: str, type: str = "api_error") -> None:
        super().__init__(message)
        self.message = message
        self.type = type
        self.partial = b""  # what the same feed() translated before the error: still the client's


class StreamTooLarge(StreamError):
    """An upstream event grew past ``bounds.MAX_EVENT_BYTES`` without ending: the framer drops it.

    Before commit it is a failover-safe ``oversized`` attempt (``classify.py``); after commit the
    relay ends the client's stream with an error event saying "stream too large"."""

    def __init__(self, limit: int, partial: bytes = b"") -> None:
        super().__init__(f"stream too large: an upstream event passed {limit} bytes without ending",
                         "stream_too_large")
        self.partial = partial


class ClientError(FirstbyteError):
    """A request refused with an OpenAI-shape error; ``status`` is the HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.close_connection = False  # answer with Connection: close (the request was not read whole)

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.code, self.param)


# The OpenAI ``type`` for a status we produce ourselves.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


def error_type(status: int) -> str:
    return _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def error_body(message: str, type: str, code: str | None = None, param: str | None = None) -> bytes:
    body: dict[str, Any] = {"error": {"message": message, "type": type, "param": param, "code": code}}
    return orjson.dumps(body)


def normalise_upstream_error(status: int, body: bytes, fallback: str) -> bytes:
    """Keep an upstream's OpenAI-shape error as it is; wrap anything else in that shape."""
    try:
        data = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        err = data["error"]
        if isinstance(err.get("message"), str):
            return orjson.dumps(
                {
                    "error": {
                        "message": err["message"],
                        "type": err.get("type") or error_type(status),
                        "param": err.get("param"),
                        "code": err.get("code"),
                    }
                }
            )
    text = body[:500].decode("utf-8", "replace").strip() if body else ""
    message = f"{fallback}: {text}" if text else fallback
    return error_body(message, error_type(status), code=f"upstream_{status}")
