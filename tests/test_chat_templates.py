"""Jinja chat templates as llama.cpp renders and analyses them.

Expected values come from llama.cpp: llama-server's tests (tools/server/tests/unit:
test_template.py, test_chat_completion.py, test_compat_anthropic.py) and the C++ tests
tests/test-chat-template.cpp (the Jinja expectations), tests/test-chat.cpp
(test_template_generation_prompt) and tests/test-chat-auto-parser.cpp (markers, caps).
The templates are llama.cpp's models/templates/*.jinja.
"""

from __future__ import annotations

import datetime

import pytest
from test_chat_refs import Reader, _find, ref_tokens, template_cases, template_source

from edgeinfer.chat import (
    ChatInputs,
    ChatMsg,
    ChatRequestError,
    chat_prompt,
    chat_settings,
    init_templates,
    prepare_chat,
)
from edgeinfer.chat.analysis import analyze_template
from edgeinfer.chat.render import ChatTemplate
from edgeinfer.chat.specialized import detect_specialized

# tools/server/tests/unit/test_tool_call.py
TEST_TOOL = {"type": "function", "function": {
    "name": "test", "description": "", "parameters": {
        "type": "object", "properties": {"success": {"type": "boolean", "const": True}},
        "required": ["success"]}}}


def server(template_name: str, reasoning: str = "auto"):
    """llama-server started with --jinja --chat-template-file <template> [--reasoning ...]
    on the suite's tinyllama2 model (BOS <s>, EOS </s>, the tokenizer adds BOS)."""
    templates = init_templates(template_source(template_name), bos_token="<s>",
                               eos_token="</s>", add_bos=True)
    return templates, chat_settings(templates, use_jinja=True, reasoning=reasoning)


# -- test_template.py ---------------------------------------------------------------------------
@pytest.mark.parametrize("tools", [None, [], [TEST_TOOL]])
@pytest.mark.parametrize("template_name,reasoning,expected_end", [
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "on", "<think>\n"),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "auto", "<think>\n"),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "off", "<think>\n</think>"),
    ("Qwen-Qwen3-0.6B", "auto", "<|im_start|>assistant\n"),
    ("Qwen-Qwen3-0.6B", "off", "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    ("Qwen-QwQ-32B", "auto", "<|im_start|>assistant\n<think>\n"),
    ("Qwen-QwQ-32B", "off", "<|im_start|>assistant\n<think>\n</think>"),
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", "auto",
     "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", "off",
     "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|>"),
])
def test_reasoning(template_name, reasoning, expected_end, tools):
    templates, settings = server(template_name, reasoning)
    body = {"messages": [{"role": "user", "content": "What is today?"}], "tools": tools}
    prompt = chat_prompt(templates, body, settings).prompt
    assert prompt.endswith(expected_end), prompt[-200:]


@pytest.mark.parametrize("tools", [None, [], [TEST_TOOL]])
@pytest.mark.parametrize("template_name,fmt", [
    ("meta-llama-Llama-3.3-70B-Instruct", "%d %b %Y"),
    ("fireworks-ai-llama-3-firefunction-v2", "%b %d %Y"),
])
def test_date_inside_prompt(template_name, fmt, tools):
    templates, settings = server(template_name)
    body = {"messages": [{"role": "user", "content": "What is today?"}], "tools": tools}
    prompt = chat_prompt(templates, body, settings).prompt
    assert datetime.date.today().strftime(fmt) in prompt


@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_add_generation_prompt(add_generation_prompt):
    templates, settings = server("meta-llama-Llama-3.3-70B-Instruct")
    body = {"messages": [{"role": "user", "content": "What is today?"}],
            "add_generation_prompt": add_generation_prompt}
    prompt = chat_prompt(templates, body, settings).prompt
    assert ("<|start_header_id|>assistant<|end_header_id|>" in prompt) == add_generation_prompt


# -- test_chat_completion.py --------------------------------------------------------------------
BOOK = [{"role": "system", "content": "Book"},
        {"role": "user", "content": "What is the best book"}]
LLAMA31_END = ("<|start_header_id|>user<|end_header_id|>\n\nWhat is the best book<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\n")


@pytest.mark.parametrize("prefill,re_prefill", [
    ("Whill", "Whill"),
    ([{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}], "Wh\n\nill"),
])
def test_chat_template_assistant_prefill(prefill, re_prefill):
    templates, settings = server("meta-llama-Llama-3.1-8B-Instruct")
    body = {"messages": [*BOOK, {"role": "assistant", "content": prefill}]}
    result = chat_prompt(templates, body, settings)
    assert result.prompt.endswith(LLAMA31_END + re_prefill)
    # llama-server does not flag the heuristic prefill as a continuation: it is streamed
    assert result.syntax.is_continuation is False


def test_chat_template_continue_final_message_vllm_compat():
    templates, settings = server("meta-llama-Llama-3.1-8B-Instruct")
    body = {"add_generation_prompt": False, "continue_final_message": True,
            "messages": [*BOOK, {"role": "assistant", "content": "Whill"}]}
    result = chat_prompt(templates, body, settings)
    assert result.prompt.endswith(LLAMA31_END + "Whill")
    assert result.syntax.is_continuation is True


def test_prefill_can_be_turned_off():
    """--no-prefill-assistant: a trailing assistant message is a whole turn."""
    templates = init_templates(template_source("meta-llama-Llama-3.1-8B-Instruct"))
    settings = chat_settings(templates, prefill_assistant=False)
    body = {"messages": [*BOOK, {"role": "assistant", "content": "Whill"}]}
    prompt = chat_prompt(templates, body, settings).prompt
    assert prompt.endswith("Whill<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")


# -- test_compat_anthropic.py ---------------------------------------------------------------------
def test_thinking_history_in_template():
    """test_anthropic_thinking_history_in_template: reasoning_content of past tool-call turns
    is rendered in <think> blocks by Qwen3's template."""
    templates, settings = server("Qwen-Qwen3-0.6B")
    reasoning_1 = "I should check the project structure first."
    reasoning_2 = "Now I need to read the main file."

    def call(call_id, name, path):
        return [{"id": call_id, "type": "function",
                 "function": {"name": name, "arguments": '{"path": "' + path + '"}'}}]

    def tool(name, description):
        return {"type": "function", "function": {
            "name": name, "description": description,
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                           "required": ["path"]}}}

    body = {"messages": [
        {"role": "user", "content": "Fix the bug in main.py"},
        {"role": "assistant", "content": "", "reasoning_content": reasoning_1,
         "tool_calls": call("call_1", "list_files", ".")},
        {"role": "tool", "tool_call_id": "call_1", "content": "main.py\nutils.py"},
        {"role": "assistant", "content": "", "reasoning_content": reasoning_2,
         "tool_calls": call("call_2", "read_file", "main.py")},
        {"role": "tool", "tool_call_id": "call_2", "content": "print('hello')"},
    ], "tools": [tool("list_files", "List files"), tool("read_file", "Read a file")]}
    prompt = chat_prompt(templates, body, settings).prompt
    assert reasoning_1 in prompt and reasoning_2 in prompt
    assert prompt.count("<think>") >= 2


# -- tests/test-chat-template.cpp (the Jinja path) ----------------------------------------------
def _jinja_case_ids():
    try:
        return [c.name for c in template_cases()[1] if c.supported_with_jinja]
    except BaseException:  # noqa: BLE001 - absent data: the test itself skips
        return ["absent"]


@pytest.mark.parametrize("name", _jinja_case_ids())
def test_template_case_renders_as_llama_cpp(name):
    """main_automated_tests' second loop: format_using_common (Jinja, generation prompt on,
    the case's BOS/EOS, no model)."""
    conversation, cases = template_cases()
    case = next(c for c in cases if c.name == name)
    templates = init_templates(case.template, bos_token=case.bos_token,
                               eos_token=case.eos_token)
    messages = [ChatMsg(role=r, content=c) for r, c in conversation + case.extra_conversation]
    prompt = prepare_chat(templates, ChatInputs(messages=messages)).prompt
    assert prompt == (case.expected_jinja or case.expected)


# -- tests/test-chat.cpp: test_template_generation_prompt ---------------------------------------
SYSTEM = ChatMsg(role="system", content="You are a helpful assistant.")
USER = ChatMsg(role="user", content="Hey there!")  # message_user
# test_template_generation_prompt's option sets
GENERATION_CASES = {
    "basic": ([SYSTEM, USER], True, "none"),
    "continuation_content": ([SYSTEM, USER, ChatMsg(content="Hello, ",
                                                    reasoning_content="I'm thinking")],
                             False, "content"),
    "continuation_reasoning": ([SYSTEM, USER, ChatMsg(reasoning_content="I'm")], False,
                               "reasoning"),
}


def generation_prompt_checks() -> list[tuple[str, str, str]]:
    """(template file, option set, expected generation prompt) for each `check(tmpls,
    <options>(), "...")` that follows a read_templates(...) in the C++ test."""
    tokens = ref_tokens("test-chat.cpp", "tests/test-chat.cpp")
    start = _find(tokens, ["test_template_generation_prompt", "("])
    stop = _find(tokens, ["test_developer_role_to_system_workaround", "("])
    checks, path = [], None
    for i in range(start, stop):
        if tokens[i].value == "read_templates" and tokens[i + 2].kind == "str":
            path = tokens[i + 2].value.rsplit("/", 1)[-1].removesuffix(".jinja")
        if tokens[i].value == "check" and tokens[i + 1].value == "(" \
                and tokens[i + 2].value == "tmpls" and tokens[i + 4].value in GENERATION_CASES:
            checks.append((path, tokens[i + 4].value, Reader(tokens, i + 8).value()))
    return checks


def _generation_ids():
    try:
        return [f"{p}-{o}" for p, o, _ in generation_prompt_checks()]
    except BaseException:  # noqa: BLE001 - absent data: the test itself skips
        return ["absent"]


@pytest.mark.parametrize("case", _generation_ids())
def test_generation_prompt(case):
    checks = {f"{p}-{o}": (p, o, e) for p, o, e in generation_prompt_checks()}
    path, option, expected = checks[case]
    source = template_source(path)
    if detect_specialized(source):
        pytest.skip(f"{path} has a dedicated llama.cpp handler ({detect_specialized(source)}),"
                    " not implemented here")
    messages, add_generation_prompt, continuation = GENERATION_CASES[option]
    inputs = ChatInputs(messages=messages, add_generation_prompt=add_generation_prompt,
                        continue_final_message=continuation)
    result = prepare_chat(init_templates(source), inputs)
    assert result.generation_prompt == expected
    assert result.prompt.endswith(expected)
    assert SYSTEM.content in result.prompt and USER.content in result.prompt


def test_generation_prompt_checks_are_read():
    checks = generation_prompt_checks()
    assert ("Reka-Edge", "basic", "assistant: <think>\n") in checks
    assert len(checks) > 20


# -- tests/test-chat-auto-parser.cpp ----------------------------------------------------------
def role_marker_cases() -> list[tuple[str, str, str]]:
    """test_role_markers_all_templates' table."""
    tokens = ref_tokens("test-chat-auto-parser.cpp", "tests/test-chat-auto-parser.cpp")
    start = _find(tokens, ["role_marker_case", ">", "cases", "="],
                  after="test_role_markers_all_templates")
    return [tuple(row) for row in Reader(tokens, start + 1).value()]


def _role_ids():
    try:
        return [row[0] for row in role_marker_cases()]
    except BaseException:  # noqa: BLE001 - absent data: the test itself skips
        return ["absent"]


@pytest.mark.parametrize("template_file", _role_ids())
def test_role_markers(template_file):
    rows = {row[0]: row for row in role_marker_cases()}
    _, user_start, assistant_start = rows[template_file]
    found = analyze_template(ChatTemplate(template_source(template_file.removesuffix(".jinja"))))
    assert (found.user_start, found.assistant_start) == (user_start, assistant_start)


@pytest.mark.parametrize("name,mode,start,end,content", [
    # test_nemotron_reasoning_detection
    ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "tag_based", "<think>\n", "\n</think>\n",
     ("plain", "", "")),
    # test_cohere_reasoning_detection
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", "tools_only", "<|START_THINKING|>",
     "<|END_THINKING|>", ("always_wrapped", "<|START_RESPONSE|>", "<|END_RESPONSE|>")),
    # test_smollm3_reasoning_detection
    ("HuggingFaceTB-SmolLM3-3B", "tag_based", "<think>", "</think>", ("plain", "", "")),
    # test_laguna_*_reasoning_detection (the Laguna patch trims the markers)
    ("poolside-Laguna-XS-2.1", "tag_based", "<think>", "</think>", None),
    ("poolside-Laguna-S-2.1", "tag_based", "<think>", "</think>", None),
    ("poolside-Laguna-XS.2", "tag_based", "<think>", "</think>", None),
])
def test_reasoning_markers(name, mode, start, end, content):
    found = analyze_template(ChatTemplate(template_source(name)))
    assert (found.reasoning_mode, found.reasoning_start, found.reasoning_end) == (mode, start,
                                                                                 end)
    if content is not None:
        assert (found.content_mode, found.content_start, found.content_end) == content


def test_laguna_stop_string():
    found = analyze_template(ChatTemplate(template_source("poolside-Laguna-XS-2.1")))
    assert "</assistant>" in found.additional_stops


@pytest.mark.parametrize("name,cap", [
    ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "supports_parallel_tool_calls"),  # auto-parser.cpp
    ("poolside-Laguna-S-2.1", "supports_preserve_reasoning"),  # auto-parser.cpp
    ("deepseek-ai-DeepSeek-V4", "supports_preserve_reasoning"),  # test-chat.cpp
])
def test_caps(name, cap):
    assert ChatTemplate(template_source(name)).caps.to_map()[cap] is True


# -- thinking on/off and request fields ---------------------------------------------------------
def test_thinking_default_follows_the_template():
    """server-context.cpp: thinking is on unless --reasoning off or the template has no
    reasoning markers; --no-jinja never thinks."""
    qwen = init_templates(template_source("Qwen-Qwen3-0.6B"))
    llama = init_templates(template_source("meta-llama-Llama-3.3-70B-Instruct"))
    assert chat_settings(qwen).enable_thinking is True
    assert chat_settings(qwen, reasoning="off").enable_thinking is False
    assert chat_settings(llama).enable_thinking is False
    assert chat_settings(qwen, use_jinja=False).enable_thinking is False
    assert chat_settings(qwen).chat_template_kwargs == {"preserve_reasoning": True}
    assert chat_settings(qwen, reasoning="on").chat_template_kwargs["enable_thinking"] is True


@pytest.mark.parametrize("request_fields,expected_end", [
    ({"chat_template_kwargs": {"enable_thinking": False}},
     "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    ({"reasoning_effort": "none"}, "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    ({"chat_template_kwargs": {"enable_thinking": True}}, "<|im_start|>assistant\n"),
    ({}, "<|im_start|>assistant\n"),
])
def test_request_turns_thinking_off(request_fields, expected_end):
    """oaicompat_chat_params_parse: the enable_thinking kwarg and reasoning_effort "none"
    override the server default for one request."""
    templates, settings = server("Qwen-Qwen3-0.6B")
    body = {"messages": [{"role": "user", "content": "Hi"}], **request_fields}
    assert chat_prompt(templates, body, settings).prompt.endswith(expected_end)


@pytest.mark.parametrize("body,message", [
    ({"messages": [{"role": "user", "content": "x"}],
      "chat_template_kwargs": {"enable_thinking": "yes"}},
     'invalid type for "enable_thinking" (expected boolean, got string)'),
    ({"messages": [{"role": "user"}]}, "All non-assistant messages must contain 'content'"),
    ({"messages": [{"role": "assistant"}]},
     "Assistant message must contain either 'content' or 'tool_calls'!"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     'Failed to parse messages: Unsupported content part type: "image_url"'),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"},
     "Invalid tool_choice: sometimes"),
    ({"messages": [{"role": "user", "content": "x"}], "reasoning_format": "verbose"},
     "Unknown reasoning format: verbose"),
    ({}, "'messages' is required"),
])
def test_request_errors(body, message):
    templates, settings = server("Qwen-Qwen3-0.6B")
    with pytest.raises(ChatRequestError) as info:
        chat_prompt(templates, body, settings)
    assert str(info.value) == message


def test_tool_call_arguments_become_objects_for_templates_that_read_them():
    """func_args_not_string: Qwen3's template reads the arguments' fields, so the JSON text
    a client sends is parsed before rendering; bad JSON is refused."""
    templates, settings = server("Qwen-Qwen3-0.6B")
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    body = {"messages": [{"role": "user", "content": "x"},
                         {"role": "assistant", "content": "", "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "c", "content": "ok"}]}
    prompt = chat_prompt(templates, body, settings).prompt
    assert '{"name": "f", "arguments": {"a": 1}}' in prompt
    call["function"]["arguments"] = "{not json"
    with pytest.raises(Exception, match="Failed to parse tool call arguments as JSON"):
        chat_prompt(templates, body, settings)


def test_system_message_merged_when_the_template_ignores_it():
    """system_message_not_supported: Gemma 2 refuses a system role."""
    templates, settings = server("google-gemma-2-2b-it")
    body = {"messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": "Hi"}]}
    prompt = chat_prompt(templates, body, settings).prompt
    assert prompt == "<start_of_turn>user\nBe brief.\nHi<end_of_turn>\n<start_of_turn>model\n"
