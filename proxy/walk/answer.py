"""Is a 2xx the answer it claims to be? The client's first bytes, or the verdict that it is not.

Both checks run in ``Walker._settle``, before the commit, so an upstream that answers 2xx with
something that is not its answer fails over and counts like any failed attempt:

- a buffered body that is not a JSON object, or whose fields have the wrong types
  (``"choices": [5]``), is ``INVALID_BODY``; one nested past what a client's parser reads, or
  with more objects and arrays than ``MAX_ANSWER_CONTAINERS``, ``classify.outsized``'s;
- a stream's opening (the events the first-token gate held, up to and with the first token) is
  translated here, not in the relay: an event in it that is not JSON or whose fields have the
  wrong types (``"tool_calls": 5``, ``"index": [1]``) is a ``malformed stream``. Any other
  failure of the opening (an error event right after the first token) is the relay's to tell,
  after the commit, as before.

Translators raise :class:`~proxy.errors.StreamError` for a stream they cannot read
(``sse.JsonEventFeed`` turns a wrongly typed event into one); ``SHAPE_ERRORS`` is what a
translator without that wrapper (a usage tap, a buffered translation) raises instead.
"""

from __future__ import annotations

from ..config import Target
from ..errors import StreamError
from ..providers import Adapter, Call
from ..providers.base import StreamTranslator
from ..scrub import Scrubber
from ..translate.chat_to_anthropic import TranslationError
from ..translate.first_token import Ended
from ..translate.sse import INVALID_STREAM, SHAPE_ERRORS, WRONG_TYPES
from .classify import INVALID_BODY, Outcome, classify_ended, is_json_object, outsized

__all__ = ["buffered_answer", "stream_opening"]


def buffered_answer(adapter: Adapter, call: Call, target: Target, first: bytes) -> bytes | Outcome:
    """The client's body from a buffered 2xx answer, or the outcome that says why it is not one."""
    if not is_json_object(first):
        return INVALID_BODY
    too_big = outsized(first)  # nested too deep, or too many containers to parse: before translate_body does
    if too_big is not None:
        return too_big
    try:
        return adapter.translate_body(call, target, first)
    except TranslationError:
        raise
    except SHAPE_ERRORS:
        return INVALID_BODY


def stream_opening(translator: StreamTranslator, first: bytes,
                   scrubber: Scrubber) -> tuple[bytes, Exception | None] | Outcome:
    """The opening in the client's shape, with the failure the relay tells after the commit (if
    any); or the ``malformed stream`` outcome when the opening is not the upstream's answer. Its
    detail may quote the upstream's bytes: scrubbed here, as every failure before the commit is."""
    try:
        return translator.feed(first), None
    except StreamError as exc:
        if exc.type != INVALID_STREAM:
            return exc.partial, exc
        detail = scrubber.text(exc.message)
    except SHAPE_ERRORS:
        detail = WRONG_TYPES
    except Exception as exc:  # a translator's own fault: the relay logs it and ends the stream
        return b"", exc
    return classify_ended(Ended("malformed stream", f"an event up to the first token: {detail}"))
