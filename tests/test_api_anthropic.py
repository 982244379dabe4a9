"""The Anthropic Messages API module against llama-server's code: every expected value below
was worked out by hand from llama.cpp's tools/server (server-chat.cpp for the request,
server-task.cpp for the replies and stream events, server-common.cpp for the SSE framing)."""

from __future__ import annotations

import json

import pytest

from edgeinfer.chat.message import ChatMsg, ToolCall, msg_diffs
from edgeinfer.server.apis import ChatMeta, ChatOutcome
from edgeinfer.server.apis.anthropic import (
    IMAGE_UNSUPPORTED,
    AnthropicReply,
    convert_request,
    count_tokens_reply,
    to_chat_body,
)
from edgeinfer.server.errors import ApiError

META = ChatMeta(model="tinyllama-2-anthropic", id="chatcmpl-abc123", created=1700000000)
PNG = "iVBORw0KGgo="


def outcome(msg: ChatMsg, finish: str = "stop", word: str = "", n_prompt: int = 20,
            n_cached: int = 4, n_decoded: int = 7) -> ChatOutcome:
    return ChatOutcome(msg, finish, n_prompt, n_cached, n_decoded, {"predicted_n": n_decoded},
                       stopping_word=word)


def parse_frames(frames: list[str]) -> list[tuple[str, dict]]:
    """Each frame as format_anthropic_sse writes it: `event: X`, `data: {json}`, blank line."""
    events = []
    for frame in frames:
        head, data, rest = frame.split("\n", 2)
        assert head.startswith("event: ") and data.startswith("data: ") and rest == "\n"
        payload = json.loads(data[len("data: "):])
        assert payload["type"] == head[len("event: "):]
        events.append((payload["type"], payload))
    return events


# -- server_chat_convert_anthropic_to_oai ----------------------------------------------------
def test_system_string_and_max_tokens():
    body = {"model": "x", "max_tokens": 50, "system": "Be terse.",
            "messages": [{"role": "user", "content": "Hi"}]}
    oai = convert_request(body)
    # "model" is not carried; system goes first; max_tokens as given
    assert oai == {"messages": [{"role": "system", "content": "Be terse."},
                                {"role": "user", "content": "Hi"}], "max_tokens": 50}


def test_system_blocks_joined_without_separator():
    system = [{"type": "text", "text": "You are "}, {"type": "image", "text": "no"},
              {"type": "text", "text": "helpful."}, {"text": "untyped"}]
    oai = convert_request({"system": system, "messages": []})
    assert oai["messages"] == [{"role": "system", "content": "You are helpful."}]


def test_system_null_absent_and_wrong_type():
    assert convert_request({"system": None, "messages": []})["messages"] == []
    # a system of another type is not null: json_value gives "" and the message is pushed
    assert convert_request({"system": 5, "messages": []})["messages"] == [
        {"role": "system", "content": ""}]


def test_billing_header_stamp_normalized():
    # normalize_anthropic_billing_header: the 5 characters after "cch=" become "fffff"
    head = "x-anthropic-billing-header: cc_version=2.1.101.e51; cc_entrypoint=cli; cch="
    text = head + "a5145;You are Claude Code."
    oai = convert_request({"system": [{"type": "text", "text": text}], "messages": []})
    assert oai["messages"][0]["content"] == head + "fffff;You are Claude Code."
    # a stamp not followed by ';' after 5 characters is left alone (llama-server logs it)
    odd = head + "a51;x"
    assert convert_request({"system": odd, "messages": []})["messages"][0]["content"] == odd
    # only a prompt that starts with the header is touched
    other = "Hello cch=a5145;"
    assert convert_request({"system": other, "messages": []})["messages"][0]["content"] == other


def test_multi_turn_strings_pass_through():
    messages = [{"role": "user", "content": "Hello"},
                {"role": "assistant", "content": "Hi there!"},
                {"role": "user", "content": "How are you?"}]
    assert convert_request({"messages": messages})["messages"] == messages


def test_text_blocks_kept_whole():
    block = {"type": "text", "text": "What is", "cache_control": {"type": "ephemeral"}}
    msg = {"role": "user", "content": [block, {"type": "text", "text": " the answer?"},
                                       {"type": "document", "source": {}}]}
    # text blocks are pushed as they are (extra keys too); unknown types are dropped
    assert convert_request({"messages": [msg]})["messages"] == [
        {"role": "user", "content": [block, {"type": "text", "text": " the answer?"}]}]


def test_messages_without_content_and_odd_content():
    messages = [{"role": "assistant"}, {"role": "user"}, {"role": "user", "content": None},
                "junk", {"role": "user", "content": []}]
    # an assistant message without content is dropped; the others pass through for the chat
    # path to judge, except an empty block array, which leaves nothing to push
    assert convert_request({"messages": messages})["messages"] == [
        {"role": "user"}, {"role": "user", "content": None}, "junk"]


def test_tool_use_and_tool_result_round_trip():
    messages = [
        {"role": "user", "content": "What's the weather?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"location": "Paris", "unit": "°C"}},
            {"type": "tool_use", "id": "toolu_2", "name": "get_time"}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 25°C"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
             "content": [{"type": "text", "text": "no "}, {"type": "text", "text": "clock"}]},
            {"type": "text", "text": "Here are the results:"}]},
    ]
    assert convert_request({"messages": messages})["messages"] == [
        {"role": "user", "content": "What's the weather?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me check."}],
         "tool_calls": [
             # input dumped compactly with UTF-8 kept (nlohmann's dump()); absent input: {}
             {"id": "toolu_1", "type": "function", "function": {
                 "name": "get_weather", "arguments": '{"location":"Paris","unit":"°C"}'}},
             {"id": "toolu_2", "type": "function", "function": {
                 "name": "get_time", "arguments": "{}"}}]},
        # the user's own text comes first, then one tool message per result; text parts of a
        # result are joined into a string; is_error is not carried
        {"role": "user", "content": [{"type": "text", "text": "Here are the results:"}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny, 25°C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "no clock"},
    ]


def test_tool_use_alone_and_result_without_content():
    messages = [
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t1", "name": "ls", "input": {"path": "."}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]},
    ]
    assert convert_request({"messages": messages})["messages"] == [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "t1", "type": "function",
             "function": {"name": "ls", "arguments": '{"path":"."}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": ""},
    ]


def test_thinking_blocks_become_reasoning_content():
    messages = [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Simple.", "signature": "sig"},
            {"type": "redacted_thinking", "data": "xyz"},
            {"type": "thinking", "thinking": " Four."},
            {"type": "text", "text": "4"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Check the files."},
            {"type": "tool_use", "id": "c1", "name": "ls", "input": {}}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "Only this."}]},
    ]
    assert convert_request({"messages": messages})["messages"][1:] == [
        {"role": "assistant", "content": [{"type": "text", "text": "4"}],
         "reasoning_content": "Simple. Four."},
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "ls", "arguments": "{}"}}],
         "reasoning_content": "Check the files."},
        {"role": "assistant", "content": "", "reasoning_content": "Only this."},
    ]


def test_tools_and_tool_choice():
    schema = {"type": "object", "properties": {"location": {"type": "string"}}}
    tools = [{"name": "get_weather", "description": "Weather", "input_schema": schema},
             {"type": "web_search_20250305", "name": "web_search"}]
    oai = convert_request({"messages": [], "tools": tools, "tool_choice": {"type": "any"}})
    assert oai["tools"] == [
        {"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                          "parameters": schema}},
        {"type": "function", "function": {"name": "web_search", "description": "",
                                          "parameters": {}}}]
    assert oai["tool_choice"] == "required"
    choices = {"auto": "auto", "tool": "required"}
    for kind, expected in choices.items():
        body = {"messages": [], "tool_choice": {"type": kind, "name": "get_weather"}}
        assert convert_request(body)["tool_choice"] == expected
    # "none", a string, and a tools value that is not an array are not mapped
    assert "tool_choice" not in convert_request({"messages": [],
                                                 "tool_choice": {"type": "none"}})
    assert "tool_choice" not in convert_request({"messages": [], "tool_choice": "auto"})
    assert "tools" not in convert_request({"messages": [], "tools": {"name": "x"}})


def test_options_in_llama_servers_order():
    body = {"messages": [], "stop_sequences": ["\n", "END"], "temperature": 0.5,
            "top_p": 0.9, "top_k": 40, "stream": True, "seed": 7, "min_p": 0.1,
            "chat_template_kwargs": {"enable_thinking": False},
            "thinking": {"type": "enabled", "budget_tokens": 50},
            "metadata": {"user_id": "test_user_123"}, "tool_choice": {"type": "auto"}}
    oai = convert_request(body)
    assert oai == {"messages": [], "tool_choice": "auto", "stop": ["\n", "END"],
                   "max_tokens": 4096, "temperature": 0.5, "top_p": 0.9, "top_k": 40,
                   "stream": True, "chat_template_kwargs": {"enable_thinking": False},
                   "thinking_budget_tokens": 50, "__metadata_user_id": "test_user_123"}
    # seed and min_p are not among the fields passed through; keys keep the C++ order
    assert list(oai) == ["messages", "tool_choice", "stop", "max_tokens", "temperature",
                         "top_p", "top_k", "stream", "chat_template_kwargs",
                         "thinking_budget_tokens", "__metadata_user_id"]


@pytest.mark.parametrize("thinking,expected", [
    ({"type": "enabled"}, 10000),  # budget absent: 10000
    ({"type": "enabled", "budget_tokens": "many"}, 10000),  # wrong type: the default
    ({"type": "enabled", "budget_tokens": 1024.9}, 1024),  # get<int> truncates
    ({"type": "disabled"}, None),
    ({"type": "adaptive"}, None),
    ("enabled", None),
])
def test_thinking_budget(thinking, expected):
    oai = convert_request({"messages": [], "thinking": thinking})
    assert oai.get("thinking_budget_tokens") == expected


def test_metadata_without_user_id_and_null_max_tokens():
    oai = convert_request({"messages": [], "metadata": {"user_id": ""}, "max_tokens": None})
    assert "__metadata_user_id" not in oai
    assert oai["max_tokens"] is None  # present, so copied as is; the chat path judges it


def test_empty_messages_accepted():
    # test_anthropic_empty_messages: llama-server answers 200
    assert to_chat_body({"model": "test", "max_tokens": 50, "messages": []}) == {
        "messages": [], "max_tokens": 50}


@pytest.mark.parametrize("body,message", [
    ({"model": "test", "max_tokens": 50}, "'messages' is required"),
    ([{"role": "user"}], "'messages' is required"),
    ({"messages": "Hello"}, "Expected 'messages' to be an array"),
    ({"messages": None}, "Expected 'messages' to be an array"),
])
def test_bad_requests(body, message):
    with pytest.raises(ApiError) as info:
        to_chat_body(body)
    assert (info.value.status, info.value.message) == (400, message)
    assert info.value.body()["error"]["type"] == "invalid_request_error"


def test_images_converted_then_refused():
    messages = [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "data": PNG}},
        {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
        {"type": "image", "source": {"type": "file", "file_id": "f1"}},
        {"type": "text", "text": "What is this?"}]}]
    oai = convert_request({"messages": messages})
    # media_type defaults to image/jpeg; a source of another type is dropped
    assert oai["messages"] == [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{PNG}"}},
        {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
        {"type": "text", "text": "What is this?"}]}]
    with pytest.raises(ApiError) as info:
        to_chat_body({"messages": messages})
    # test_anthropic_vision_format_accepted: a 500 whose message says so
    assert info.value.status == 500
    assert "image input is not supported" in info.value.body()["error"]["message"].lower()


def test_tool_result_with_image():
    result = {"type": "tool_result", "tool_use_id": "tool_1", "content": [
        {"type": "text", "text": "File: test.png"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": PNG}}]}
    oai = convert_request({"messages": [{"role": "user", "content": [result]}]})
    # with an image the parts are kept as an array (OpenAI's multimodal tool message)
    assert oai["messages"] == [{"role": "tool", "tool_call_id": "tool_1", "content": [
        {"type": "text", "text": "File: test.png"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]}]
    with pytest.raises(ApiError) as info:
        to_chat_body({"messages": [{"role": "user", "content": [result]}]})
    assert (info.value.status, info.value.message) == (500, IMAGE_UNSUPPORTED)


def test_image_of_unknown_source_is_dropped_not_refused():
    msg = {"role": "user", "content": [{"type": "image", "source": {"type": "file"}},
                                       {"type": "text", "text": "hi"}]}
    assert to_chat_body({"messages": [msg]})["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]}]


def test_count_tokens_reply():
    # handle_count_tokens: {"input_tokens": n}, "object" only on the OpenAI routes
    assert count_tokens_reply(12) == {"input_tokens": 12}


# -- server_task_result_cmpl_final::to_json_anthropic ----------------------------------------
def test_reply_text():
    reply = AnthropicReply(META, {}).reply(
        outcome(ChatMsg(content="Hello!"), n_prompt=20, n_cached=4, n_decoded=3))
    assert reply == {
        "id": "chatcmpl-abc123", "type": "message", "role": "assistant",
        "content": [{"type": "text", "text": "Hello!"}], "model": "tinyllama-2-anthropic",
        "stop_reason": "end_turn", "stop_sequence": None,
        # input_tokens excludes the cached prompt tokens
        "usage": {"cache_read_input_tokens": 4, "input_tokens": 16, "output_tokens": 3}}
    assert list(reply) == ["id", "type", "role", "content", "model", "stop_reason",
                           "stop_sequence", "usage"]
    assert "timings" not in reply


def test_reply_thinking_then_text():
    msg = ChatMsg(content="4", reasoning_content="2+2 is 4.")
    assert AnthropicReply(META, {}).reply(outcome(msg))["content"] == [
        {"type": "thinking", "thinking": "2+2 is 4.", "signature": ""},
        {"type": "text", "text": "4"}]


def test_reply_tool_use():
    calls = (ToolCall("get_weather", '{"location": "Paris"}', "k2mQ9"),
             ToolCall("broken", '{"loc', "x7"))
    reply = AnthropicReply(META, {}).reply(
        outcome(ChatMsg(content="", tool_calls=calls), "tool_calls"))
    assert reply["stop_reason"] == "tool_use"
    # arguments that do not parse give an empty input
    assert reply["content"] == [
        {"type": "tool_use", "id": "k2mQ9", "name": "get_weather",
         "input": {"location": "Paris"}},
        {"type": "tool_use", "id": "x7", "name": "broken", "input": {}}]


def test_reply_empty_message_has_no_blocks():
    assert AnthropicReply(META, {}).reply(outcome(ChatMsg()))["content"] == []


@pytest.mark.parametrize("finish,word,calls,reason,sequence", [
    ("stop", "", (), "end_turn", None),  # STOP_TYPE_EOS
    ("stop", "END", (), "end_turn", "END"),  # STOP_TYPE_WORD: end_turn, stop_sequence set
    ("length", "", (), "max_tokens", None),  # STOP_TYPE_LIMIT
    ("tool_calls", "", (ToolCall("f", "{}", "i"),), "tool_use", None),
    ("length", "", (ToolCall("f", "{", "i"),), "max_tokens", None),  # the limit wins
])
def test_stop_reasons(finish, word, calls, reason, sequence):
    reply = AnthropicReply(META, {}).reply(outcome(ChatMsg(tool_calls=calls), finish, word))
    assert (reply["stop_reason"], reply["stop_sequence"]) == (reason, sequence)


# -- the stream: partial to_json_anthropic, final to_json_anthropic_stream -------------------
def test_stream_thinking_text_and_tool_call():
    reply = AnthropicReply(META, {"stream": True})
    steps = [ChatMsg(reasoning_content="Let me"),
             ChatMsg(reasoning_content="Let me think."),
             ChatMsg(reasoning_content="Let me think.", content="It is"),
             ChatMsg(reasoning_content="Let me think.", content="It is"),  # held back
             ChatMsg(reasoning_content="Let me think.", content="It is sunny.",
                     tool_calls=(ToolCall("get_weather", '{"loc', "call_1"),)),
             ChatMsg(reasoning_content="Let me think.", content="It is sunny.",
                     tool_calls=(ToolCall("get_weather", '{"location": "Paris"}', "call_1"),))]
    frames = reply.start(n_prompt=20, n_cached=4)
    prev = ChatMsg()
    for msg in steps:
        frames += reply.update(msg_diffs(prev, msg))
        prev = msg
    frames += reply.end(outcome(steps[-1], "tool_calls", n_decoded=15))

    def start(i, block):
        return ("content_block_start", {"type": "content_block_start", "index": i,
                                        "content_block": block})

    def delta(i, d):
        return ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": d})

    def stop(i):
        return ("content_block_stop", {"type": "content_block_stop", "index": i})

    assert parse_frames(frames) == [
        ("message_start", {"type": "message_start", "message": {
            "id": "chatcmpl-abc123", "type": "message", "role": "assistant", "content": [],
            "model": "tinyllama-2-anthropic", "stop_reason": None, "stop_sequence": None,
            "usage": {"cache_read_input_tokens": 4, "input_tokens": 16, "output_tokens": 0}}}),
        start(0, {"type": "thinking", "thinking": ""}),
        delta(0, {"type": "thinking_delta", "thinking": "Let me"}),
        delta(0, {"type": "thinking_delta", "thinking": " think."}),
        # reasoning seen: the text block is 1
        start(1, {"type": "text", "text": ""}),
        delta(1, {"type": "text_delta", "text": "It is"}),
        delta(1, {"type": "text_delta", "text": " sunny."}),
        # tool call 0 after thinking and text: block 2; its start has no input
        start(2, {"type": "tool_use", "id": "call_1", "name": "get_weather"}),
        delta(2, {"type": "input_json_delta", "partial_json": '{"loc'}),
        delta(2, {"type": "input_json_delta", "partial_json": 'ation": "Paris"}'}),
        # the final: thinking closes after an empty signature, then text, then the call
        delta(0, {"type": "signature_delta", "signature": ""}),
        stop(0), stop(1), stop(2),
        ("message_delta", {"type": "message_delta",
                           "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                           "usage": {"output_tokens": 15}}),
        ("message_stop", {"type": "message_stop"}),
    ]


def test_stream_text_only_and_exact_bytes():
    reply = AnthropicReply(META, {"stream": True})
    frames = reply.start(n_prompt=9, n_cached=0)
    frames += reply.update(msg_diffs(ChatMsg(), ChatMsg(content="Hé")))
    frames += reply.end(outcome(ChatMsg(content="Hé"), "length", n_decoded=30))
    # compact JSON, UTF-8 kept, keys in the C++ order
    assert frames[1:] == [
        'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
        '"content_block":{"type":"text","text":""}}\n\n',
        'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        '"delta":{"type":"text_delta","text":"Hé"}}\n\n',
        'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n',
        'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":'
        '"max_tokens","stop_sequence":null},"usage":{"output_tokens":30}}\n\n',
        'event: message_stop\ndata: {"type":"message_stop"}\n\n',
    ]


def test_stream_stop_sequence():
    reply = AnthropicReply(META, {"stream": True})
    reply.update(msg_diffs(ChatMsg(), ChatMsg(content="1 2 3")))
    events = parse_frames(reply.end(outcome(ChatMsg(content="1 2 3"), "stop", "END")))
    assert events[-2][1]["delta"] == {"stop_reason": "end_turn", "stop_sequence": "END"}


def test_stream_final_parse_diffs():
    # the final parse may release text the partial parse held back and complete a tool call;
    # to_json_anthropic_stream renders those diffs with its block indexes
    # (has_thinking + has_text + i for calls)
    reply = AnthropicReply(META, {"stream": True})
    reply.update(msg_diffs(ChatMsg(), ChatMsg(content="Hi")))
    final = ChatMsg(content="Hi there", tool_calls=(ToolCall("ls", '{"path":"."}', "c9"),))
    events = parse_frames(reply.end(outcome(final, "tool_calls", n_decoded=5)))
    assert [(name, data.get("index")) for name, data in events] == [
        ("content_block_delta", 0),  # the text block already started: no second start
        ("content_block_start", 1), ("content_block_delta", 1),
        ("content_block_stop", 0), ("content_block_stop", 1),
        ("message_delta", None), ("message_stop", None)]
    assert events[0][1]["delta"] == {"type": "text_delta", "text": " there"}
    assert events[1][1]["content_block"] == {"type": "tool_use", "id": "c9", "name": "ls"}
    assert events[2][1]["delta"] == {"type": "input_json_delta", "partial_json": '{"path":"."}'}


def test_stream_final_extends_started_call_without_restarting():
    # llama-server's final would repeat content_block_start here (its started-set is local to
    # to_json_anthropic_stream); each block starts once here, so indexes stay sequential, as
    # test_anthropic_streaming_content_block_indices requires
    reply = AnthropicReply(META, {"stream": True})
    reply.update(msg_diffs(ChatMsg(), ChatMsg(tool_calls=(ToolCall("f", '{"a', "i1"),))))
    final = ChatMsg(tool_calls=(ToolCall("f", '{"a": 1}', "i1"),))
    events = parse_frames(reply.end(outcome(final, "tool_calls")))
    assert [(name, data.get("index")) for name, data in events[:2]] == [
        ("content_block_delta", 0), ("content_block_stop", 0)]
    assert events[0][1]["delta"]["partial_json"] == '": 1}'


def test_stream_two_calls_in_one_chunk_and_empty_update():
    reply = AnthropicReply(META, {"stream": True})
    assert reply.update([]) == []
    calls = (ToolCall("a", "{}", "id_a"), ToolCall("b", "", "id_b"))
    events = parse_frames(reply.update(msg_diffs(ChatMsg(), ChatMsg(tool_calls=calls))))
    # no reasoning, no text: calls are blocks 0 and 1; an empty argument delta sends nothing
    assert [(name, data["index"]) for name, data in events] == [
        ("content_block_start", 0), ("content_block_delta", 0), ("content_block_start", 1)]


def test_stream_error_frame():
    reply = AnthropicReply(META, {"stream": True})
    body = ApiError(500, "boom").body()
    # format_anthropic_sse({"event": "error", "data": <format_error_response>})
    expected = ['event: error\ndata: {"code":500,"message":"boom","type":"server_error"}\n\n']
    assert reply.error(body) == expected
    assert reply.error(body["error"]) == expected
