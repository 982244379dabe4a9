"""The OpenAI Responses API (server/apis/oai_responses.py) against llama-server's code.

Every expected value is read off llama.cpp (vendor/llama.cpp/tools/server, the llama-cpp-python
0.3.36 sdist): the conversion off server_chat_convert_responses_to_chatcmpl (server-chat.cpp),
the replies off server_task_result_cmpl_final::to_json_oaicompat_resp[_stream] and
server_task_result_cmpl_partial::update / to_json_oaicompat_resp (server-task.cpp), the frames
off format_oai_resp_sse (server-common.cpp), the token count off handle_count_tokens
(server-context.cpp).
"""

from __future__ import annotations

import copy
import json
import re
import time

import pytest

from edgeinfer.chat.message import ChatMsg, MsgDiff, ToolCall, msg_diffs
from edgeinfer.server.apis import ChatMeta, ChatOutcome
from edgeinfer.server.apis.oai_responses import (
    ResponsesReply,
    input_tokens_reply,
    response_id,
    to_chat_body,
)
from edgeinfer.server.errors import ApiError

RANDOM = "[0-9A-Za-z]{32}"  # random_string(): 32 of "0-9A-Za-z"
META = ChatMeta(model="tiny.gguf", id="resp_" + "A" * 32, created=1700000000)
TIMINGS = {"prompt_n": 5, "prompt_ms": 1.0, "prompt_per_second": 5000.0, "predicted_n": 3,
           "predicted_ms": 3.0, "predicted_per_second": 1000.0}


def outcome(message: ChatMsg, finish: str = "stop", timings: dict | None = None) -> ChatOutcome:
    return ChatOutcome(message, finish, n_prompt=12, n_cached=4, n_decoded=3,
                       timings=TIMINGS if timings is None else timings)


# to_json_oaicompat_resp[_stream]: usage from n_prompt_tokens (cached included), n_decoded and
# n_prompt_tokens_cache
USAGE = {"input_tokens": 12, "output_tokens": 3, "total_tokens": 15,
         "input_tokens_details": {"cached_tokens": 4}}


def refused(body: dict) -> str:
    with pytest.raises(ApiError) as info:
        to_chat_body(body)
    assert info.value.status == 400 and info.value.type == "invalid_request_error"
    return info.value.message


# -- conversion: server_chat_convert_responses_to_chatcmpl ----------------------------------
def test_string_input_instructions_and_renamed_fields():
    body = {"model": "gpt-4.1", "input": "Hi", "instructions": "Be terse.",
            "max_output_tokens": 8, "temperature": 0.8, "top_p": 0.9, "stream": True,
            "reasoning": {"effort": "low", "summary": "auto"},
            "tool_choice": "required", "text": {"format": {"type": "json_object"}}}
    chat = to_chat_body(body)
    # input and instructions erased, messages set after the copied fields, max_output_tokens
    # erased and max_tokens appended, reasoning erased after reasoning_effort appended; the
    # rest (temperature, top_p, stream, tool_choice, text) copied untouched
    assert chat == {"model": "gpt-4.1", "temperature": 0.8, "top_p": 0.9, "stream": True,
                    "tool_choice": "required", "text": {"format": {"type": "json_object"}},
                    "messages": [{"role": "system", "content": "Be terse."},
                                 {"role": "user", "content": "Hi"}],
                    "max_tokens": 8, "reasoning_effort": "low"}
    assert list(chat)[-3:] == ["messages", "max_tokens", "reasoning_effort"]


def test_instructions_that_are_no_string_give_an_empty_system_message():
    # json_value(response_body, "instructions", std::string()) falls back to ""
    for value in (None, 3):
        chat = to_chat_body({"input": "Hi", "instructions": value})
        assert chat["messages"][0] == {"role": "system", "content": ""}


def test_reasoning_without_effort_is_dropped():
    assert to_chat_body({"input": "x", "reasoning": {"summary": "auto"}}) == {
        "messages": [{"role": "user", "content": "x"}]}
    assert to_chat_body({"input": "x", "reasoning": None}) == {
        "messages": [{"role": "user", "content": "x"}]}


def test_input_messages_with_string_content():
    # the llama.cpp test's input: string content becomes one input_text, then one text part
    chat = to_chat_body({"input": [{"role": "system", "content": "Book"},
                                   {"role": "user", "content": "What is the best book"}]})
    assert chat["messages"] == [
        {"role": "system", "content": [{"text": "Book", "type": "text"}]},
        {"role": "user", "content": [{"text": "What is the best book", "type": "text"}]}]


def test_input_message_parts_and_kept_fields():
    item = {"type": "message", "role": "developer", "status": "completed", "id": "m1",
            "content": [{"type": "input_text", "text": "look"},
                        {"type": "input_image", "image_url": "data:image/png;base64,AA",
                         "detail": "auto"}]}
    [message] = to_chat_body({"input": [item]})["messages"]
    # type and status erased, other fields kept, content replaced in place
    assert message == {"role": "developer", "id": "m1", "content": [
        {"text": "look", "type": "text"},
        {"image_url": {"url": "data:image/png;base64,AA"}, "type": "image_url"}]}
    assert list(message) == ["role", "id", "content"]


def test_function_call_round_trip_merges_into_the_assistant_message():
    items = [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": "{\"city\":\"Paris\"}", "id": "fc_1", "status": "completed"},
        {"type": "function_call", "call_id": "call_2", "name": "get_time",
         "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_2",
         "output": [{"type": "input_text", "text": "noon"},
                    {"type": "input_image", "image_url": "http://x/clock.png"}]},
    ]
    messages = to_chat_body({"input": items})["messages"]
    assert messages == [
        {"role": "user", "content": [{"text": "Weather in Paris?", "type": "text"}]},
        {"role": "assistant", "id": "msg_1", "content": [{"text": "Checking.", "type": "text"}],
         "tool_calls": [
             {"function": {"arguments": "{\"city\":\"Paris\"}", "name": "get_weather"},
              "id": "call_1", "type": "function"},
             {"function": {"arguments": "{}", "name": "get_time"}, "id": "call_2",
              "type": "function"}]},
        {"content": "sunny", "role": "tool", "tool_call_id": "call_1"},
        {"content": [{"type": "text", "text": "noon"},
                     {"type": "image_url", "image_url": {"url": "http://x/clock.png"}}],
         "role": "tool", "tool_call_id": "call_2"},
    ]


def test_function_call_after_a_user_message_opens_an_assistant_message():
    items = [{"role": "user", "content": "hi"},
             {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]
    assert to_chat_body({"input": items})["messages"][1] == {
        "role": "assistant",
        "tool_calls": [{"function": {"arguments": "{}", "name": "f"}, "id": "c",
                        "type": "function"}]}


def test_reasoning_items():
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [],
                 "content": [{"type": "reasoning_text", "text": "think"}]}
    answer = {"type": "message", "role": "assistant",
              "content": [{"type": "output_text", "text": "42"}]}
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
    messages = to_chat_body({"input": [{"role": "user", "content": "q"}, reasoning, answer,
                                       call]})["messages"]
    # a new assistant message with empty content; the output message and the call merge in
    assert messages[1:] == [{"role": "assistant",
                             "content": [{"text": "42", "type": "text"}],
                             "reasoning_content": "think",
                             "tool_calls": [{"function": {"arguments": "{}", "name": "f"},
                                             "id": "c", "type": "function"}]}]
    # after an assistant message it sets (overwrites) that message's reasoning_content
    messages = to_chat_body({"input": [answer, reasoning]})["messages"]
    assert messages == [{"role": "assistant", "content": [{"text": "42", "type": "text"}],
                         "reasoning_content": "think"}]


def test_assistant_string_content_and_refusal():
    items = [{"type": "message", "role": "assistant", "content": "plain"},
             {"type": "message", "role": "assistant",
              "content": [{"type": "refusal", "refusal": "no"}]}]
    assert to_chat_body({"input": items})["messages"] == [
        {"role": "assistant", "content": [{"text": "plain", "type": "text"},
                                          {"refusal": "no", "type": "refusal"}]}]


def test_tools_become_chat_tools():
    tools = [{"type": "function", "name": "get_weather", "description": "d",
              "parameters": {"type": "object", "properties": {}}},
             {"type": "web_search"},
             {"type": "function", "name": "loose", "strict": False, "parameters": {}},
             "junk"]
    chat = to_chat_body({"input": "x", "tools": tools})
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "get_weather", "description": "d",
                                          "parameters": {"type": "object", "properties": {}},
                                          "strict": True}},
        {"type": "function", "function": {"name": "loose", "strict": False,
                                          "parameters": {}}}]
    # no function tool: `tools` is erased
    assert "tools" not in to_chat_body({"input": "x", "tools": [{"type": "web_search"}]})


def test_previous_response_id_that_is_no_string_is_ignored():
    # json_value(..., std::string{}) reads null or a number as ""
    assert to_chat_body({"input": "x", "previous_response_id": None})[
        "previous_response_id"] is None
    assert to_chat_body({"input": "x", "previous_response_id": ""})["messages"]


def test_the_request_is_not_modified():
    body = {"input": [{"role": "user", "content": "hi"},
                      {"type": "function_call_output", "call_id": "c",
                       "output": [{"type": "input_text", "text": "t"}]}],
            "tools": [{"type": "function", "name": "f"}]}
    before = copy.deepcopy(body)
    to_chat_body(body)
    assert body == before


@pytest.mark.parametrize(("body", "message"), [
    ({"model": "m"}, "'input' is required"),
    ({"input": "x", "previous_response_id": "resp_1"},
     "llama.cpp does not support 'previous_response_id'."),
    ({"input": 3}, "'input' must be a string or array of objects"),
    ({"input": None}, "'input' must be a string or array of objects"),
    ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]},
     "'Input text' requires 'text'"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
     "'image_url' is required"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
     "'input_file' is not supported by llamacpp at this moment"),
    ({"input": [{"role": "user", "content": [{"type": "output_text", "text": "t"}]}]},
     "'type' must be one of 'input_text', 'input_image', or 'input_file'"),
    ({"input": [{"role": "user", "content": ["bare"]}]},
     "'type' must be one of 'input_text', 'input_image', or 'input_file'"),
    # an assistant message needs type "message"; a bare string item matches nothing
    ({"input": [{"role": "assistant", "content": "hi"}]}, "Cannot determine type of 'item'"),
    ({"input": ["hello"]}, "Cannot determine type of 'item'"),
    ({"input": [{"role": "tool", "content": "x"}]}, "Cannot determine type of 'item'"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]},
     "Cannot determine type of 'item'"),
    ({"input": [{"type": "message", "role": "assistant",
                 "content": [{"type": "output_text", "text": 1}]}]},
     "'Output text' requires 'text'"),
    ({"input": [{"type": "message", "role": "assistant",
                 "content": [{"type": "refusal"}]}]}, "'Refusal' requires 'refusal'"),
    ({"input": [{"type": "message", "role": "assistant",
                 "content": [{"type": "input_image", "image_url": "u"}]}]},
     "'type' must be one of 'output_text' or 'refusal'"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": [{"text": "t"}]}]},
     "Output of tool call missing 'type' field"),
    ({"input": [{"type": "function_call_output", "call_id": "c",
                 "output": [{"type": "output_text", "text": "t"}]}]},
     "Output of tool call should be 'Input text' or 'Input image'"),
    ({"input": [{"type": "function_call_output", "call_id": "c",
                 "output": [{"type": "input_image"}]}]}, "'image_url' is required"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "item['content'] is not an array"),
    ({"input": [{"type": "reasoning", "summary": [], "content": []}]},
     "item['content'] is empty"),
    ({"input": [{"type": "reasoning", "summary": [], "content": [{"text": 1}]}]},
     "item['content']['text'] is not a string"),
    ({"input": "x", "tools": {"type": "function"}}, "'tools' must be an array of objects"),
    ({"input": "x", "tools": None}, "'tools' must be an array of objects"),
])
def test_bad_requests(body, message):
    assert refused(body) == message


def test_input_tokens_reply():
    seen = []

    def count(chat_body: dict) -> int:
        seen.append(chat_body)
        return 7

    # handle_count_tokens: the converted body, then {"input_tokens": n} plus, for the OpenAI
    # APIs, "object": "response.input_tokens"
    assert input_tokens_reply({"input": "Hello world"}, count) == {
        "input_tokens": 7, "object": "response.input_tokens"}
    assert seen == [{"messages": [{"role": "user", "content": "Hello world"}]}]
    with pytest.raises(ApiError):
        input_tokens_reply({}, count)


def test_response_id():
    assert re.fullmatch("resp_" + RANDOM, response_id())
    assert response_id() != response_id()


# -- non-stream replies: to_json_oaicompat_resp ---------------------------------------------
def test_text_reply():
    before = int(time.time())
    reply = ResponsesReply(META, {}).reply(outcome(ChatMsg(content="Suddenly")))
    after = int(time.time())
    assert before <= reply["created_at"] == reply["completed_at"] <= after
    [item] = reply["output"]
    assert re.fullmatch("msg_" + RANDOM, item["id"])
    assert item == {"content": [{"type": "output_text", "annotations": [], "logprobs": [],
                                 "text": "Suddenly"}],
                    "id": item["id"], "role": "assistant", "status": "completed",
                    "type": "message"}
    assert reply == {"completed_at": reply["created_at"], "created_at": reply["created_at"],
                     "id": META.id, "model": "tiny.gguf", "object": "response",
                     "output": [item], "status": "completed", "usage": USAGE}
    assert list(reply) == ["completed_at", "created_at", "id", "model", "object", "output",
                           "status", "usage"]


def test_reasoning_and_text_reply():
    msg = ChatMsg(content="42", reasoning_content="Let me think.")
    reasoning, message = ResponsesReply(META, {}).reply(outcome(msg))["output"]
    assert re.fullmatch("rs_" + RANDOM, reasoning["id"])
    assert reasoning == {"id": reasoning["id"], "summary": [], "type": "reasoning",
                         "content": [{"text": "Let me think.", "type": "reasoning_text"}],
                         "encrypted_content": "", "status": "completed"}
    assert message["type"] == "message" and message["content"][0]["text"] == "42"


def test_function_call_reply():
    calls = (ToolCall("get_weather", '{"city":"Paris"}', "a" * 32), ToolCall("f", "{}", "b1"))
    reply = ResponsesReply(META, {}).reply(outcome(ChatMsg(tool_calls=calls), "tool_calls"))
    # fc_ / call_ + the tool call's id; no message item for empty content
    assert reply["output"] == [
        {"id": "fc_" + "a" * 32, "type": "function_call", "status": "completed",
         "arguments": '{"city":"Paris"}', "call_id": "call_" + "a" * 32,
         "name": "get_weather"},
        {"id": "fc_b1", "type": "function_call", "status": "completed", "arguments": "{}",
         "call_id": "call_b1", "name": "f"}]


def test_length_limited_reply_is_still_completed():
    # to_json_oaicompat_resp writes "completed" whatever the stop type; no incomplete_details
    reply = ResponsesReply(META, {}).reply(outcome(ChatMsg(content="Sudden"), "length"))
    assert reply["status"] == "completed" and "incomplete_details" not in reply


def test_empty_reply_has_no_output():
    assert ResponsesReply(META, {}).reply(outcome(ChatMsg()))["output"] == []


# -- streams: partial update/to_json_oaicompat_resp, final to_json_oaicompat_resp_stream ------
def parse(frames: list[str]) -> list[tuple[str | None, dict]]:
    """Each frame as (event name, data); a frame must be whole, one event."""
    events = []
    for frame in frames:
        assert frame.endswith("\n\n") and frame.count("\n\n") == 1
        lines = frame[:-2].split("\n")
        name = lines[0][len("event: "):] if lines[0].startswith("event: ") else None
        assert lines[-1].startswith("data: ") and len(lines) == (2 if name else 1)
        data = json.loads(lines[-1][len("data: "):])
        if name is not None:
            assert data["type"] == name
        events.append((name, data))
    return events


def names(events: list[tuple[str | None, dict]]) -> list[str | None]:
    return [name for name, _ in events]


def stream_of(messages: list[ChatMsg]) -> list[list[MsgDiff]]:
    """The diffs of successive partial parses (common_chat_msg_diff::compute_diffs)."""
    prev, out = ChatMsg(), []
    for msg in messages:
        out.append(msg_diffs(prev, msg))
        prev = msg
    return out


def test_text_stream():
    reply = ResponsesReply(META, {})
    opening = parse(reply.start())
    deltas = [parse(reply.update(d)) for d in stream_of([ChatMsg(content="Sud"),
                                                         ChatMsg(content="Suddenly")])]
    closing = parse(reply.end(outcome(ChatMsg(content="Suddenly"))))
    status = {"id": META.id, "object": "response", "status": "in_progress"}
    assert opening == [("response.created", {"type": "response.created", "response": status}),
                       ("response.in_progress",
                        {"type": "response.in_progress", "response": status})]
    msg_id = reply.message_id
    assert re.fullmatch("msg_" + RANDOM, msg_id)
    assert deltas[0] == [
        ("response.output_item.added", {"type": "response.output_item.added", "item": {
            "content": [], "id": msg_id, "role": "assistant", "status": "in_progress",
            "type": "message"}}),
        ("response.content_part.added", {"type": "response.content_part.added",
                                         "item_id": msg_id,
                                         "part": {"type": "output_text", "text": ""}}),
        ("response.output_text.delta", {"type": "response.output_text.delta",
                                        "item_id": msg_id, "delta": "Sud"})]
    assert deltas[1] == [("response.output_text.delta", {
        "type": "response.output_text.delta", "item_id": msg_id, "delta": "denly"})]
    part = {"type": "output_text", "annotations": [], "logprobs": [], "text": "Suddenly"}
    item = {"type": "message", "status": "completed", "id": msg_id, "content": [part],
            "role": "assistant"}
    assert closing[:3] == [
        ("response.output_text.done", {"type": "response.output_text.done",
                                       "item_id": msg_id, "text": "Suddenly"}),
        ("response.content_part.done", {"type": "response.content_part.done",
                                        "item_id": msg_id, "part": part}),
        ("response.output_item.done", {"type": "response.output_item.done", "item": item})]
    name, completed = closing[3]
    assert name == "response.completed" and len(closing) == 4
    assert abs(completed["response"]["created_at"] - time.time()) < 5
    assert completed == {"type": "response.completed", "response": {
        "id": META.id, "object": "response", "created_at": completed["response"]["created_at"],
        "status": "completed", "model": "tiny.gguf", "output": [item], "usage": USAGE},
        "timings": TIMINGS}


def test_frames_are_compact_and_ordered_as_llama_writes_them():
    reply = ResponsesReply(ChatMeta("m", "resp_x", 0), {})
    assert reply.start()[0] == ('event: response.created\n'
                                'data: {"type":"response.created","response":{"id":"resp_x",'
                                '"object":"response","status":"in_progress"}}\n\n')
    assert reply.update([MsgDiff(content_delta="é")])[-1] == (
        'event: response.output_text.delta\n'
        f'data: {{"type":"response.output_text.delta","item_id":"{reply.message_id}",'
        '"delta":"é"}\n\n')


def test_reasoning_text_and_tool_call_stream():
    call_id = "c" * 32
    messages = [
        ChatMsg(reasoning_content="Hmm"),
        ChatMsg(reasoning_content="Hmm, rain?", content="Let me check."),
        ChatMsg(reasoning_content="Hmm, rain?", content="Let me check.",
                tool_calls=(ToolCall("get_weather", '{"ci', call_id),)),
        ChatMsg(reasoning_content="Hmm, rain?", content="Let me check.",
                tool_calls=(ToolCall("get_weather", '{"city":"Paris"}', call_id),)),
    ]
    reply = ResponsesReply(META, {})
    events = parse(reply.start())
    for diffs in stream_of(messages):
        events += parse(reply.update(diffs))
    final = messages[-1]
    events += parse(reply.end(outcome(final, "tool_calls", timings={})))
    rs, msg, fc = reply.reasoning_id, reply.message_id, "fc_" + call_id
    assert re.fullmatch("rs_" + RANDOM, rs)
    assert names(events) == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.output_item.done",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.done",
        "response.completed"]
    data = [d for _, d in events]
    assert data[2]["item"] == {"id": rs, "summary": [], "type": "reasoning", "content": [],
                               "encrypted_content": "", "status": "in_progress"}
    assert [(d["item_id"], d["delta"]) for d in data[3:5]] == [(rs, "Hmm"), (rs, ", rain?")]
    assert data[8]["item"] == {"id": fc, "arguments": "", "call_id": "call_" + call_id,
                               "name": "get_weather", "type": "function_call",
                               "status": "in_progress"}
    assert [(d["item_id"], d["delta"]) for d in data[9:11]] == [(fc, '{"ci'),
                                                                (fc, 'ty":"Paris"}')]
    # the final reasoning item carries no status (unlike the non-stream one)
    reasoning_item = {"id": rs, "summary": [], "type": "reasoning",
                      "content": [{"text": "Hmm, rain?", "type": "reasoning_text"}],
                      "encrypted_content": ""}
    call_item = {"id": fc, "type": "function_call", "status": "completed",
                 "arguments": '{"city":"Paris"}', "call_id": "call_" + call_id,
                 "name": "get_weather"}
    assert data[11]["item"] == reasoning_item and data[15]["item"] == call_item
    output = data[16]["response"]["output"]
    assert [item["type"] for item in output] == ["reasoning", "message", "function_call"]
    assert output[0] == reasoning_item and output[1]["id"] == msg and output[2] == call_item
    assert "timings" not in data[16]  # no stats: no timings


def test_update_opens_the_stream_itself():
    # the first partial result (n_decoded == 1) carries response.created and in_progress
    reply = ResponsesReply(META, {})
    assert names(parse(reply.update([MsgDiff(content_delta="a")]))) == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta"]
    assert reply.start() == []
    assert reply.update([]) == []  # a partial without diffs sends nothing


def test_progress_and_timings_per_token():
    # llama's test_responses_stream_with_llama_telemetry: prompt_progress on
    # response.in_progress, timings on the output_text.delta and beside response.completed
    reply = ResponsesReply(META, {})
    progress = {"total": 40, "cache": 0, "processed": 32, "time_ms": 3}
    first = parse(reply.progress(progress, TIMINGS))
    assert names(first) == ["response.created", "response.in_progress"]
    assert "prompt_progress" not in first[0][1]
    assert first[1][1] == {"type": "response.in_progress", "response": {
        "id": META.id, "object": "response", "status": "in_progress"},
        "timings": TIMINGS, "prompt_progress": progress}
    second = parse(reply.progress(dict(progress, processed=40)))
    assert names(second) == ["response.in_progress"]
    assert second[0][1]["prompt_progress"]["processed"] == 40
    assert "timings" not in second[0][1]
    deltas = parse(reply.update([MsgDiff(content_delta="S")], TIMINGS))
    assert names(deltas) == ["response.output_item.added", "response.content_part.added",
                             "response.output_text.delta"]
    assert deltas[-1][1]["timings"] == TIMINGS
    assert all("timings" not in d for _, d in deltas[:-1])
    completed = parse(reply.end(outcome(ChatMsg(content="S"))))[-1][1]
    assert completed["timings"] == TIMINGS and completed["response"]["usage"] == USAGE


def test_end_without_output():
    # an empty message: response.completed alone, with no output items
    events = parse(ResponsesReply(META, {}).end(outcome(ChatMsg(), timings={})))
    assert names(events) == ["response.completed"]
    assert events[0][1]["response"]["output"] == []


def test_error_frame_has_no_event_line():
    # a mid-stream error: format_oai_sse(json {{"error", res_json}}), then the stream ends
    body = {"error": {"code": 500, "message": "boom", "type": "server_error"}}
    reply = ResponsesReply(META, {})
    assert reply.error(body) == [
        'data: {"error":{"code":500,"message":"boom","type":"server_error"}}\n\n']
    assert reply.error(body["error"]) == reply.error(body)
