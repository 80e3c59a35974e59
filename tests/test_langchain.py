"""LangChain's ChatOpenAI with ``use_responses_api=True`` through firstbyte's /v1/responses, with a
bound tool, against the simulated provider."""

from __future__ import annotations

import pytest

langchain_openai = pytest.importorskip("langchain_openai", reason="langchain-openai is in the dev extra")

from langchain_core.messages import HumanMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402

from .conftest import Recorder, route_config  # noqa: E402

SIM = {"kind": "simulated", "simulate": {"first_chunk_ms": 1, "jitter_ms": 0, "chunk_ms": 0, "chunks": 4}}


@tool
def lookup_city(city: str) -> str:
    """Facts about a city."""
    return f"{city} is on a fjord"


@pytest.mark.parametrize("stream", [pytest.param(False, id="invoke"), pytest.param(True, id="stream")])
async def test_responses_api_with_a_tool_round_trip(proxy, stream):
    recorder = Recorder()
    p = await proxy(route_config([{"provider": "sim", "model": "sim-1"}], {"sim": SIM}), observers=[recorder])
    llm = langchain_openai.ChatOpenAI(model="chat", base_url=p.url + "/v1", api_key="unused", max_retries=0,
                                      use_responses_api=True, streaming=stream)
    bound = llm.bind_tools([lookup_city])
    history = [HumanMessage("please lookup_city for me")]
    first = await bound.ainvoke(history)
    assert [(c["name"], c["args"]) for c in first.tool_calls] == [("lookup_city", {"city": "sim"})]
    call = first.tool_calls[0]
    history += [first, ToolMessage(lookup_city.invoke(call["args"]), tool_call_id=call["id"])]
    second = await bound.ainvoke(history)
    assert second.text.strip() == "The tool returned: sim is on a fjord"
    await p.stop()
    assert [f.path for f in recorder.seen] == ["/v1/responses", "/v1/responses"]
    assert all(f.status == 200 and f.stream is stream for f in recorder.seen)
