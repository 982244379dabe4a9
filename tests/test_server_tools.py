"""Tool calls over a real socket with the `openai` client (issue 34): SmolLM2 served with
Qwen 2.5's template (both ChatML, so the model follows it), every tool_choice, streamed and
not, the arguments validated against each function's schema with `jsonschema`, and the
call's result rendered into the next turn."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import openai
import pytest
from test_server_harness import ServerProcess, idle_around_test

pytest.importorskip("llguidance", reason="the 'structured' extra")
pytestmark = pytest.mark.real

TEMPLATE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edgeinfer" \
    / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}},
           "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather",
                                           "description": "The weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "description": "a + b",
                                           "parameters": {"type": "object", "properties": {
                                               "a": {"type": "integer"},
                                               "b": {"type": "integer"}},
                                               "required": ["a", "b"]}}}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def shared_server(real_model):
    if not TEMPLATE.exists():
        pytest.skip(f"{TEMPLATE} is absent (scripts/fetch_vocab_tests.py fetches it)")
    srv = ServerProcess(real_model("SmolLM2-135M-Instruct.Q4_1.gguf"), "-np", "2", "-c",
                        "2048", "--chat-template-file", str(TEMPLATE))
    yield srv
    srv.stop()


@pytest.fixture
def client(shared_server):
    for srv in idle_around_test(shared_server):
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)


def create(client, **kwargs):
    """One call at most unless asked (parallel_tool_calls): a small model would call again
    and again."""
    kwargs.setdefault("parallel_tool_calls", False)
    kwargs.setdefault("max_tokens", 96)
    return client.chat.completions.create(model="m", messages=kwargs.pop("messages", ASK),
                                          tools=TOOLS, temperature=0, **kwargs)


def check_calls(calls, names=None) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id
        assert names is None or call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                  "function": {"name": "add"}}])
def test_forced_calls_parse_and_validate(client, choice):
    reply = create(client, tool_choice=choice).choices[0]
    assert reply.finish_reason == "tool_calls" and not reply.message.content
    named = None if choice == "required" else {"add"}
    check_calls(reply.message.tool_calls, named)
    assert len(reply.message.tool_calls) == 1  # parallel_tool_calls false


def test_parallel_calls_may_repeat(client):
    reply = create(client, tool_choice="required", parallel_tool_calls=True,
                   max_tokens=200).choices[0]
    check_calls(reply.message.tool_calls)


def test_streamed_calls_assemble_to_the_whole_reply(client):
    whole = create(client, tool_choice="required").choices[0].message.tool_calls
    calls: dict[int, dict] = {}
    finish = None
    for chunk in create(client, tool_choice="required", stream=True):
        if not chunk.choices:
            continue
        finish = chunk.choices[0].finish_reason or finish
        for delta in chunk.choices[0].delta.tool_calls or ():
            call = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
            if delta.id:
                assert call["id"] is None, "an id is sent once"
                call["id"] = delta.id
            if delta.function and delta.function.name:
                call["name"] += delta.function.name
            if delta.function and delta.function.arguments:
                call["arguments"] += delta.function.arguments
    assert finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls.values()] == \
        [(c.function.name, c.function.arguments) for c in whole]


def test_none_and_auto(client):
    reply = create(client, tool_choice="none").choices[0]
    assert reply.message.tool_calls is None and reply.message.content
    reply = create(client, tool_choice="auto").choices[0]  # free text unless it calls
    if reply.message.tool_calls:
        check_calls(reply.message.tool_calls)
    else:
        assert reply.message.content


def test_the_tool_result_renders_in_the_next_turn(client, shared_server):
    call = create(client, tool_choice="required").choices[0].message.tool_calls[0]
    messages = ASK + [{"role": "assistant", "content": "", "tool_calls": [call.model_dump()]},
                      {"role": "tool", "tool_call_id": call.id, "content": "18 degrees"}]
    import httpx

    prompt = httpx.post(shared_server.url + "/apply-template",
                        json={"messages": messages, "tools": TOOLS}).json()["prompt"]
    assert f'"name": "{call.function.name}"' in prompt
    assert "<tool_response>\n18 degrees\n</tool_response>" in prompt
    reply = create(client, messages=messages, tool_choice="none").choices[0]
    assert reply.finish_reason in ("stop", "length") and reply.message.content


def test_bad_tool_requests_are_400(client):
    with pytest.raises(openai.BadRequestError, match="tool"):
        create(client, tool_choice={"type": "function", "function": {"name": "nope"}})
    with pytest.raises(openai.BadRequestError, match="Cannot use custom grammar"):
        create(client, tool_choice="required", response_format={"type": "json_object"})
