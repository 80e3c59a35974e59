"""What a provider adapter is: it translates, it does not dial.

An adapter turns a client's call into an :class:`UpstreamRequest` for one
target, and tells the walker how to read the provider's answers (context
overflow, error bodies, streams in another shape). The walker owns the
transport and the session.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..config import Provider, Target
from ..translate.first_token import FirstToken
from ..upstream.transport import UpstreamRequest  # what an adapter builds: the wire's record

if TYPE_CHECKING:
    from ..traceparent import TraceContext

PATHS = {
    "chat": "/chat/completions",
    "completions": "/completions",
    "embeddings": "/embeddings",
    "messages": "/messages",
    "responses": "/responses",
}


@dataclass(slots=True)  # built per request: a frozen init costs about three times as much
class Call:
    """A client's request as the walker sees it: the operation and the decoded body."""

    op: str  # chat | completions | embeddings | messages | responses
    body: dict[str, Any]
    stream: bool
    wants_usage: bool = False  # the client itself asked for stream_options.include_usage
    beta: str | None = None  # the client's anthropic-beta header, for Anthropic targets only
    trace: TraceContext | None = None  # tracing on: stamps each attempt's traceparent (proxy/traceparent.py)
    # The server's work for while the upstream thinks: run at a 2xx stream's head, before its first token
    # (the header's planned part, ``Decision.planned_fields``), so the commit does not wait for it.
    meanwhile: Callable[[], object] | None = None


class StreamTranslator(Protocol):
    """Turns one provider's stream bytes into the client's bytes, incrementally.

    Everything the relay asks of a committed stream, so it needs no special case per shape."""

    done: bool  # the end marker has been translated: the answer is whole
    usage: dict[str, int] | None  # OpenAI-shape token counts, once the stream has said them

    def feed(self, data: bytes) -> bytes:
        """The client's bytes for ``data``; a broken stream raises a ``StreamError``."""
        ...

    def finish(self) -> bytes:
        """What is still held when the upstream's body ends."""
        ...

    def error_event(self, message: str) -> bytes:
        """The event that ends a stream broken after commit, in the client's shape."""
        ...


class Adapter(Protocol):
    def build(self, provider: Provider, target: Target, call: Call) -> UpstreamRequest: ...

    def is_context_overflow(self, status: int, body: bytes) -> bool: ...

    def error_body(self, status: int, body: bytes) -> bytes:
        """The upstream's error in the OpenAI shape."""
        ...

    def client_error(self, call: Call, status: int, body: bytes) -> bytes:
        """A 4xx returned to the client (not failover-safe), in the client's shape."""
        ...

    def translate_body(self, call: Call, target: Target, body: bytes) -> bytes:
        """A buffered 2xx body in the client's shape."""
        ...

    def stream_translator(self, call: Call, target: Target) -> StreamTranslator:
        """The translator of a committed stream (asked only of streamed calls)."""
        ...

    def first_token(self, call: Call) -> FirstToken:
        """The gate that holds this provider's stream back until its first token."""
        ...
