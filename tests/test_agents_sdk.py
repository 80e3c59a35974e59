"""The OpenAI Agents SDK (its default: the Responses API) running an agent with one function tool
against the simulated provider through firstbyte, with no key."""

from __future__ import annotations

import openai
import pytest

agents = pytest.importorskip("agents", reason="openai-agents is in the dev extra: scripts/test installs it")

from .conftest import decision_of, route_config  # noqa: E402

SIM = {"kind": "simulated", "simulate": {"first_chunk_ms": 1, "jitter_ms": 0, "chunk_ms": 0, "chunks": 6}}


@pytest.fixture(autouse=True)
def no_tracing():
    agents.set_tracing_disabled(True)  # traces would go to OpenAI's platform
    yield


@pytest.mark.parametrize("streamed", [pytest.param(False, id="run"), pytest.param(True, id="run-streamed")])
async def test_an_agent_calls_its_tool_and_answers_with_the_result(proxy, streamed):
    p = await proxy(route_config([{"provider": "sim", "model": "sim-1"}], {"sim": SIM}))
    calls: list[str] = []

    @agents.function_tool
    def get_weather(city: str, days: int) -> str:
        """The weather forecast for a city."""
        calls.append(f"{city}/{days}")
        return f"sunny in {city} for {days} days"

    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="unused", max_retries=0)
    model = agents.OpenAIResponsesModel(model="chat", openai_client=client)
    agent = agents.Agent(name="forecaster", instructions="Answer with the forecast.", model=model,
                         tools=[get_weather])
    ask = "Use get_weather for Oslo, please."
    if streamed:
        result = agents.Runner.run_streamed(agent, ask)
        kinds = [event.type async for event in result.stream_events()]
        assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
    else:
        result = await agents.Runner.run(agent, ask)
    await client.close()
    assert calls == ["sim/1"]  # arguments built from the tool's schema: a string and an integer
    assert result.final_output.startswith("The tool returned: sunny in sim for 1 days")
    items = [item.type for item in result.new_items]
    assert items == ["tool_call_item", "tool_call_output_item", "message_output_item"]
    usage = result.context_wrapper.usage
    assert usage.requests == 2 and usage.input_tokens > 0 and usage.output_tokens > 0


async def test_the_agents_requests_are_routed(proxy):
    p = await proxy(route_config([{"provider": "sim", "model": "sim-1"}], {"sim": SIM}))
    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="unused", max_retries=0)
    raw = await client.responses.with_raw_response.create(model="chat", input="hi")
    await client.close()
    assert decision_of(dict(raw.headers)).served == "sim"
