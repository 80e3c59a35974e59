"""``kind: azure``: Azure OpenAI, the OpenAI wire format at deployment URLs.

Azure serves each model as a *deployment* of a resource: the target's ``model``
is the deployment name, the URL is
``{base_url}/openai/deployments/{deployment}/{operation}?api-version=…`` and the
key goes in ``api-key`` rather than ``Authorization``. Bodies and answers are
OpenAI's, so everything else (usage taps, errors, overflow) is the OpenAI
adapter's; ``/v1/responses`` and ``/v1/messages`` reach Azure through their
translations to chat completions.
"""

from __future__ import annotations

from urllib.parse import quote

import orjson

from ..config import Provider, Target, path_segment_problem
from ..translate.chat_to_anthropic import TranslationError
from .base import PATHS, Call, UpstreamRequest
from .openai import OpenAIAdapter, upstream_body

__all__ = ["AzureAdapter"]


class AzureAdapter(OpenAIAdapter):
    def build(self, provider: Provider, target: Target, call: Call) -> UpstreamRequest:
        """The deployment is a path segment: one that could leave ``/deployments/`` (``..``, a
        slash) is refused here too, whichever way it came (a pin is refused before, at planning)."""
        problem = path_segment_problem(target.model)
        if problem is not None:
            raise TranslationError("model", f"the Azure deployment {target.model!r} {problem}")
        body = upstream_body(target, call)
        del body["model"]  # the deployment in the URL names the model
        headers = {"content-type": "application/json"}
        if provider.headers:
            headers.update(provider.headers)
        if provider.api_key:
            headers["api-key"] = provider.api_key
        url = (f"{provider.base_url}/openai/deployments/{quote(target.model, safe='')}{PATHS[call.op]}"
               f"?api-version={quote(provider.api_version, safe='')}")
        return UpstreamRequest("POST", url, headers, orjson.dumps(body))
