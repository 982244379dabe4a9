"""Reading reasoning and content out of generated text (edgeinfer/chat/parser.py, peg.py).

The reference cases are llama.cpp's tests/test-chat.cpp test_template_output_peg_parsers,
read from the C++: each input is fed one character at a time, as test_peg_parser does, the
diffs are accumulated, and the result must equal both the message parsed at each step and
the expected message (compared with surrounding whitespace stripped, as
assert_msg_equals(..., ignore_whitespace_differences=true) does). Cases with tools or a
JSON schema are test_chat_tools.py's; templates llama.cpp hands to a dedicated parser are
not handled here and are skipped with their reason.
"""

from __future__ import annotations

import pytest
from test_chat_refs import peg_cases, template_source, uses_tools

from edgeinfer.chat import (
    ChatInputs,
    ChatMsg,
    ChatParseError,
    ChatParser,
    ContentPart,
    MsgDiff,
    chat_prompt,
    chat_settings,
    init_templates,
    msg_diffs,
    peg,
    prepare_chat,
)
from edgeinfer.chat.specialized import detect_specialized

TOOL_CALLS = {"tools", "json_schema", "tool_choice", "parallel_tool_calls", "expect_tool_calls"}
ENUMS = {
    "COMMON_REASONING_FORMAT_NONE": "none", "COMMON_REASONING_FORMAT_AUTO": "auto",
    "COMMON_REASONING_FORMAT_DEEPSEEK": "deepseek",
    "COMMON_REASONING_FORMAT_DEEPSEEK_LEGACY": "deepseek-legacy",
    "COMMON_CHAT_CONTINUATION_NONE": "none", "COMMON_CHAT_CONTINUATION_AUTO": "auto",
    "COMMON_CHAT_CONTINUATION_CONTENT": "content",
    "COMMON_CHAT_CONTINUATION_REASONING": "reasoning",
}


def accumulate(parser: ChatParser, pieces: list[str], partial_end: bool = False) -> ChatMsg:
    """Feed the pieces (the last through finish() unless `partial_end`) and rebuild the
    message from the diffs alone (after what the parser starts with), checking it against
    the parser's after every piece."""
    content, reasoning = parser.message.content, parser.message.reasoning_content
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1 and not partial_end
        for diff in parser.finish(piece) if last else parser.feed(piece):
            assert diff.tool_call_index == -1
            content += diff.content_delta
            reasoning += diff.reasoning_content_delta
        assert (content, reasoning) == (parser.message.content,
                                        parser.message.reasoning_content)
    return ChatMsg(content=content, reasoning_content=reasoning)


# -- llama.cpp's parser cases -----------------------------------------------------------------
def _msg(ref, table: dict) -> dict | None:
    """A message argument: a named message or simple_assist_msg(...); None with tool calls."""
    if ref[0] == "ident":
        fields = table[ref[1]]
    else:
        args = [*ref[2], "", "", "", ""]
        fields = {"role": "assistant", "content": args[0], "reasoning_content": args[1],
                  "tool_calls": [args[2]] if args[2] or args[4] else []}
    return None if fields.get("tool_calls") else fields


def _chat_msg(fields: dict) -> ChatMsg:
    parts = tuple(ContentPart(t, x) for t, x in fields.get("content_parts", ()))
    return ChatMsg(role=fields["role"], content=fields["content"],
                   reasoning_content=fields.get("reasoning_content", ""), content_parts=parts)


def _case_setup(case, table):
    """(inputs, expected message, is_partial), or a reason to skip."""
    inputs = ChatInputs(messages=[_chat_msg(table["message_user"])])
    expect, partial = {"content": "", "reasoning_content": ""}, False
    for method, args in case.calls:
        if method in TOOL_CALLS:
            return "tool calls are parsed by the tool-call layer"
        value = args[0] if args else None
        if method == "reasoning_format":
            inputs.reasoning_format = ENUMS[value[1]]
        elif method == "continue_final_message":
            inputs.continue_final_message = ENUMS[value[1]]
        elif method in ("enable_thinking", "add_generation_prompt"):
            setattr(inputs, method, value)
        elif method == "messages":
            fields = [_msg(m, table) for m in value]
            if None in fields:
                return "the messages carry tool calls"
            inputs.messages = [_chat_msg(f) for f in fields]
        elif method == "expect":
            fields = _msg(value, table)
            if fields is None:
                return "the expected message has tool calls"
            expect = {"content": fields["content"],
                      "reasoning_content": fields["reasoning_content"]}
        elif method in ("expect_content", "expect_reasoning"):
            expect["content" if method == "expect_content" else "reasoning_content"] = value
        elif method == "is_partial":
            partial = value
        elif method not in ("run", "expect_reconstruction"):
            return f"unknown builder call {method}"
    return inputs, expect, partial


def _peg_ids():
    try:
        cases, table = peg_cases()
    except BaseException:  # noqa: BLE001 - absent data: the test itself skips
        return ["absent"]
    return [f"{name}@{case.line}" for case in cases for name in case.templates
            if not uses_tools(case, table)]


@pytest.mark.parametrize("case_id", _peg_ids())
def test_llama_cpp_parser_case(case_id):
    cases, table = peg_cases()  # skips when the reference is absent
    name, line = case_id.rsplit("@", 1)
    case = next(c for c in cases if c.line == int(line))
    setup = _case_setup(case, table)
    if isinstance(setup, str):
        pytest.skip(setup)
    source = template_source(name)
    if detect_specialized(source):
        pytest.skip(f"llama.cpp parses {name} with its {detect_specialized(source)} handler")
    inputs, expect, partial = setup
    prompt = prepare_chat(init_templates(source), inputs)
    parser = ChatParser(prompt.syntax, echo=True)  # test_peg_parser starts from nothing
    streamed = accumulate(parser, list(case.input), partial_end=partial)
    assert (streamed.content.strip(), streamed.reasoning_content.strip()) == (
        expect["content"].strip(), expect["reasoning_content"].strip())


# -- the llama-server behaviours the chat endpoints rely on -------------------------------------
def qwen3(reasoning_format: str = "deepseek", **body):
    templates = init_templates(template_source("Qwen-Qwen3-0.6B"))
    body = {"messages": [{"role": "user", "content": "Hi"}],
            "reasoning_format": reasoning_format, **body}
    return chat_prompt(templates, body, chat_settings(templates))


def test_deepseek_format_splits_reasoning():
    parser = ChatParser(qwen3().syntax)
    message = accumulate(parser, ["<think>\nI think\n</think>\n\nHello"])
    assert (message.reasoning_content, message.content) == ("I think\n", "Hello")


def test_none_format_leaves_think_in_content():
    """reasoning_format "none": the reasoning parser is left out of the grammar."""
    text = "<think>\nI think\n</think>\n\nHello"
    message = accumulate(ChatParser(qwen3("none").syntax), [text])
    assert (message.reasoning_content, message.content) == ("", text)


def test_legacy_format_is_deepseek_in_this_llama_cpp():
    """deepseek-legacy only changes the reported reasoning_in_content flag now; the parser
    extracts reasoning exactly as deepseek does."""
    text = "<think>\nI think\n</think>\n\nHello"
    assert accumulate(ChatParser(qwen3("deepseek-legacy").syntax), [text]) == \
        accumulate(ChatParser(qwen3("deepseek").syntax), [text])


def test_forced_open_thinking_keeps_the_prompt_marker():
    """QwQ's prompt ends in "<think>\\n": the model's text starts inside the reasoning, and
    with format "none" the prompt's marker shows in the content."""
    templates = init_templates(template_source("Qwen-QwQ-32B"))
    body = {"messages": [{"role": "user", "content": "Hi"}]}
    settings = chat_settings(templates)
    prompt = chat_prompt(templates, {**body, "reasoning_format": "deepseek"}, settings)
    assert prompt.prompt.endswith("<think>\n")
    message = accumulate(ChatParser(prompt.syntax), ["Let me see\n</think>\n42"])
    # QwQ's markers are the bare tags (its old-Qwen patch): the newlines around them stay,
    # as in llama.cpp's common_chat_parse (its tests compare with whitespace stripped)
    assert (message.reasoning_content, message.content) == ("\nLet me see\n", "\n42")
    prompt = chat_prompt(templates, {**body, "reasoning_format": "none"}, settings)
    message = accumulate(ChatParser(prompt.syntax), ["Let me see\n</think>\n42"])
    assert message.content == "<think>\nLet me see\n</think>\n42"


@pytest.mark.parametrize("template_name,reasoning,expected", [
    ("Qwen-QwQ-32B", "auto", True),
    ("Qwen-QwQ-32B", "off", False),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "on", True),
    ("Qwen-Qwen3-0.6B", "auto", False),
    ("Qwen-Qwen3-0.6B", "off", False),
    ("meta-llama-Llama-3.3-70B-Instruct", "auto", False),
])
def test_starts_in_reasoning(template_name, reasoning, expected):
    templates = init_templates(template_source(template_name))
    body = {"messages": [{"role": "user", "content": "Hi"}]}
    syntax = chat_prompt(templates, body, chat_settings(templates, reasoning=reasoning)).syntax
    assert syntax.starts_in_reasoning is expected


def test_empty_thinking_block_gives_no_reasoning():
    """With thinking off QwQ's prompt ends in "<think>\n</think>": the reasoning read is
    only whitespace, which common_chat_peg_mapper drops."""
    templates = init_templates(template_source("Qwen-QwQ-32B"))
    settings = chat_settings(templates, reasoning="off")
    body = {"messages": [{"role": "user", "content": "Hi"}], "reasoning_format": "deepseek"}
    prompt = chat_prompt(templates, body, settings)
    assert prompt.prompt.endswith("<think>\n</think>")
    parser = ChatParser(prompt.syntax)
    assert parser.feed("42") == [MsgDiff(content_delta="42")]
    assert parser.message == ChatMsg(content="42")


def test_partial_markers_are_held_back():
    parser = ChatParser(qwen3().syntax)
    assert parser.feed("<thi") == []
    assert parser.feed("nk>\nabc") == [MsgDiff(reasoning_content_delta="abc")]
    assert parser.feed("</th") == []  # could be the end marker
    assert parser.feed("ink>\n\nHel") == [MsgDiff(content_delta="Hel")]
    assert parser.finish("lo") == [MsgDiff(content_delta="lo")]
    assert (parser.message.reasoning_content, parser.message.content) == ("abc", "Hello")


def test_text_that_only_looked_like_a_marker_is_released():
    parser = ChatParser(qwen3().syntax)
    assert parser.feed("<thx") == [MsgDiff(content_delta="<thx")]
    assert parser.finish() == []


@pytest.mark.parametrize("template_name,reasoning_format,text", [
    ("Qwen-Qwen3-0.6B", "deepseek", "<think>\nLet me think.\n</think>\n\nThe answer is 4."),
    ("Qwen-Qwen3-0.6B", "none", "<think>\nLet me think.\n</think>\n\nThe answer is 4."),
    ("Qwen-QwQ-32B", "deepseek", "Hmm, <b>2+2</b>.\n</think>\nFour </thin"),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "deepseek", "Sure.\n</think>\n\nFour."),
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", "deepseek",
     "<|START_THINKING|>plan<|END_THINKING|><|START_RESPONSE|>Four<|END_RESPONSE|>"),
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", "none",
     "<|START_THINKING|>plan<|END_THINKING|><|START_RESPONSE|>Four<|END_RESPONSE|>"),
    ("meta-llama-Llama-3.3-70B-Instruct", "deepseek", "<think>not special</think> here"),
])
def test_every_split_gives_the_same_message(template_name, reasoning_format, text):
    """The diffs of a stream add up to the message of the whole text, wherever the text is
    cut into pieces."""
    templates = init_templates(template_source(template_name))
    body = {"messages": [{"role": "user", "content": "2+2?"}],
            "reasoning_format": reasoning_format}
    syntax = chat_prompt(templates, body, chat_settings(templates)).syntax
    whole = accumulate(ChatParser(syntax), [text])
    assert whole.content or whole.reasoning_content
    for cut in range(len(text) + 1):
        assert accumulate(ChatParser(syntax), [text[:cut], text[cut:]]) == whole, cut
    assert accumulate(ChatParser(syntax), list(text)) == whole


def test_output_that_misses_the_wrapping_markers_fails():
    """Command R7B's content must be inside <|START_RESPONSE|>. Its template writes the turn
    opener itself, so the generation prompt is empty, and a text that cannot start the
    grammar fails at once, streaming or not, as llama.cpp's common_chat_peg_parse does
    (a partial parse only passes a mismatch after the first character)."""
    templates = init_templates(template_source("CohereForAI-c4ai-command-r7b-12-2024-tool_use"))
    body = {"messages": [{"role": "user", "content": "Hi"}], "reasoning_format": "deepseek"}
    syntax = chat_prompt(templates, body, chat_settings(templates)).syntax
    parser = ChatParser(syntax)
    assert parser.feed("<|START_RESP") == []
    assert parser.feed("ONSE|>Hi") == [MsgDiff(content_delta="Hi")]
    with pytest.raises(ChatParseError, match="does not match the expected peg-native format"):
        ChatParser(syntax).feed("Hello")


def test_no_jinja_output_is_all_content():
    templates = init_templates("llama3")
    body = {"messages": [{"role": "user", "content": "Hi"}]}
    settings = chat_settings(templates, use_jinja=False)
    parser = ChatParser(chat_prompt(templates, body, settings).syntax)
    assert parser.feed("<think>a</think>b") == [MsgDiff(content_delta="<think>a</think>b")]


def test_continued_message_is_not_streamed_again():
    """continue_final_message: the prefilled reasoning and content are part of the message
    from the start (task_result_state parses "" first) and only new text is sent, unless
    the request asks for echo."""
    body = {"messages": [{"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "Hello, ",
                          "reasoning_content": "I'm thinking"}],
            "continue_final_message": True, "add_generation_prompt": False}
    prompt = qwen3(**body)
    assert prompt.prompt.endswith("<|im_start|>assistant\n<think>\nI'm thinking\n</think>\n\n"
                                  "Hello, ")
    parser = ChatParser(prompt.syntax)
    # Qwen3's end marker is "\n</think>\n\n"; the reasoning is read up to "</think>"
    assert (parser.message.reasoning_content, parser.message.content) == ("I'm thinking\n",
                                                                          "Hello, ")
    assert parser.feed("world!") == [MsgDiff(content_delta="world!")]
    assert parser.message.content == "Hello, world!"
    echo = ChatParser(prompt.syntax, echo=True)
    assert echo.feed("world!") == [MsgDiff(reasoning_content_delta="I'm thinking\n"),
                                   MsgDiff(content_delta="Hello, world!")]


def test_continued_reasoning():
    """A prefill with only reasoning continues inside the thinking block."""
    body = {"messages": [{"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "", "reasoning_content": "I'm"}],
            "continue_final_message": True, "add_generation_prompt": False}
    prompt = qwen3(**body)
    assert prompt.prompt.endswith("<|im_start|>assistant\n<think>\nI'm")
    parser = ChatParser(prompt.syntax)
    message = accumulate(parser, [" sure\n</think>\n\nYes"])
    assert (message.reasoning_content, message.content) == ("I'm sure\n", "Yes")


def test_diffs_tolerate_an_erased_stop_word():
    """string_diff: a text that shrinks to a prefix of itself adds nothing."""
    assert msg_diffs(ChatMsg(content="Hello</"), ChatMsg(content="Hello")) == [
        MsgDiff(content_delta="")]
    with pytest.raises(ValueError):
        msg_diffs(ChatMsg(content="Hello"), ChatMsg(content="Help"))


# -- the PEG engine -----------------------------------------------------------------------------
def test_literal_cut_by_the_end_needs_more_input():
    grammar = peg.literal("<think>")
    assert peg.parse(grammar, "<thi", lenient=True).status is peg.Status.NEED_MORE
    assert peg.parse(grammar, "<thi", lenient=False).status is peg.Status.FAIL
    assert peg.parse(grammar, "<tho", lenient=True).status is peg.Status.FAIL


def test_until_stops_before_a_partial_delimiter():
    grammar = peg.tag("r", peg.until("</think>"))
    result = peg.parse(grammar, "abc</th", lenient=True)
    assert (result.status, result.nodes[0].text) == (peg.Status.SUCCESS, "abc")
    result = peg.parse(grammar, "abc</tx", lenient=True)
    assert (result.status, result.nodes[0].text) == (peg.Status.NEED_MORE, "abc</tx")
    result = peg.parse(grammar, "a</think>b", lenient=False)
    assert (result.end, result.nodes[0].text) == (1, "a")


def test_optspace_makes_the_surrounding_whitespace_optional():
    grammar = peg.optspace("\n</think>\n\n") + peg.end()
    for text in ("</think>", "\n</think>", "</think>\n", "\n</think>\n\n"):
        assert peg.parse(grammar, text, lenient=False).success, text
    assert not peg.parse(grammar, " </think>", lenient=False).success


def test_sequence_keeps_nodes_up_to_a_need_more():
    grammar = peg.tag("a", peg.until("|")) + "|" + peg.tag("b", peg.literal("end"))
    result = peg.parse(grammar, "xy|en", lenient=True)
    assert result.status is peg.Status.NEED_MORE
    # a tag keeps its partial text (common_peg_tag_parser); atomic() is what drops it
    assert [(n.tag, n.text) for n in peg.walk(result.nodes)] == [("a", "xy"), ("b", "en")]


def test_atomic_drops_a_half_parsed_child():
    grammar = peg.atomic(peg.tag("t", peg.literal("ab") + peg.literal("cd")))
    assert peg.parse(grammar, "abc", lenient=True).nodes == []
    assert peg.parse(grammar, "abcd", lenient=True).nodes[0].text == "abcd"


def test_extract_tags_anywhere():
    grammar = peg.tag("pre", peg.marker() + peg.space()) + "X" \
        + peg.tag("post", peg.space() + peg.marker())
    result, tags = peg.extract_tags(grammar, "junk <a>\nX </b> tail", anywhere=True)
    assert result.success and tags == {"pre": "<a>\n", "post": " </b>"}
