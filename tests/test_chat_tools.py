"""Tool calls: template analysis, output parsing, grammars (edgeinfer/chat/tool_*.py,
mapper.py, grammar.py).

The reference cases are llama.cpp's tests/test-chat.cpp test_template_output_peg_parsers
chains that use tools, read from the C++ and checked as its test_peg_parser does:

* the input is fed one character at a time; the diffs, accumulated, must equal the message
  parsed at each step (tool-call arguments compared as re-serialised JSON, a partial one
  as nothing, text with surrounding whitespace stripped), and the final message the
  expected one;
* the grammar (here llguidance Lark) must accept the text from the trigger on (lazy) or
  the generation prompt and the text (not lazy), and a lazy grammar's trigger must fire
  when calls are expected;
* with expect_reconstruction, rendering the parsed message after the conversation must
  reproduce the prompt and the model's text: assistant tool-call messages render back as
  the model writes them.
"""

from __future__ import annotations

import json

import pytest
from test_chat_reasoning import ENUMS as REASONING_ENUMS  # noqa: E402
from test_chat_refs import (
    peg_cases,
    peg_tools,
    template_source,
    tool_json,
    uses_tools,
)

from edgeinfer.chat import (
    ChatInputs,
    ChatMsg,
    ChatParser,
    ChatTool,
    ContentPart,
    ToolCall,
    init_templates,
    prepare_chat,
)
from edgeinfer.chat.specialized import detect_specialized

llguidance = pytest.importorskip("llguidance")

ENUMS = {
    **REASONING_ENUMS,  # the reasoning and continuation names test_chat_reasoning reads
    "COMMON_CHAT_TOOL_CHOICE_AUTO": "auto", "COMMON_CHAT_TOOL_CHOICE_NONE": "none",
    "COMMON_CHAT_TOOL_CHOICE_REQUIRED": "required",
}


# -- llguidance with a byte tokenizer -----------------------------------------------------------
class _ByteVocab:
    """256 byte tokens and an EOS: any text is a token sequence, so a grammar can be checked
    against exact strings."""

    def __init__(self):
        self.tokens = [bytes([i]) for i in range(256)] + [b"<eos>"]
        self.eos_token_id, self.bos_token_id, self.special_token_ids = 256, None, [256]

    def __call__(self, text):
        return list(text.encode() if isinstance(text, str) else text)


_TOKENIZER = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteVocab()), slices=[])


def grammar_error(grammar: str, text: str | None = None) -> str:
    """"" when the Lark grammar compiles (and accepts `text` completely), else why not."""
    matcher = llguidance.LLMatcher(_TOKENIZER, llguidance.LLMatcher.grammar_from_lark(grammar),
                                   log_level=0)
    if matcher.is_error():
        return matcher.get_error()
    for token in _ByteVocab()(text or ""):
        if not matcher.consume_token(token):
            return f"rejected: {matcher.get_error()[:600]}"
    if text is not None and not matcher.is_accepting():
        return "the grammar expects more"
    return ""


# -- reading llama.cpp's cases ------------------------------------------------------------------
def _calls_of(fields: list) -> tuple[ToolCall, ...]:
    calls = []
    for call in fields:
        name, args, call_id = [*call, "", ""][:3]
        calls.append(ToolCall(name, args, call_id if isinstance(call_id, str) else ""))
    return tuple(calls)


def _message(ref, messages: dict) -> ChatMsg:
    """A message argument: a named message or a call of one of test-chat.cpp's helpers."""
    if ref[0] == "ident":
        fields = messages[ref[1]]
        parts = tuple(ContentPart(t, x) for t, x in fields.get("content_parts", ()))
        return ChatMsg(role=fields["role"], content=fields["content"],
                       reasoning_content=fields.get("reasoning_content", ""),
                       content_parts=parts, tool_calls=_calls_of(fields["tool_calls"]))
    helper, args = ref[1], ref[2]
    if helper == "simple_assist_msg":
        content, reasoning, name, arguments, call_id = [*args, "", "", "", ""][:5]
        calls = ((ToolCall(name, arguments, call_id),) if name or call_id else ())
        return ChatMsg(content=content, reasoning_content=reasoning, tool_calls=calls)
    if helper == "message_with_tool_calls":
        return ChatMsg(tool_calls=(ToolCall(args[0], args[1]),))
    if helper == "message_with_tool_calls_and_reasoning":
        return ChatMsg(reasoning_content=args[2], tool_calls=(ToolCall(args[0], args[1]),))
    if helper == "message_with_content_and_tool_call":
        return ChatMsg(content=args[0], tool_calls=(ToolCall(args[1], args[2]),))
    if helper == "message_with_reasoning_and_tool_call":
        return ChatMsg(reasoning_content=args[0], tool_calls=(ToolCall(args[1], args[2]),))
    if helper == "message_with_reasoning_content_and_multiple_tool_calls":
        return ChatMsg(reasoning_content=args[0], content=args[1],
                       tool_calls=_calls_of(args[2]))
    raise ValueError(f"unknown message helper {helper}")


def _tool(ref, tools: dict) -> ChatTool:
    spec = tools[ref[1]] if isinstance(ref, tuple) else tool_json(*ref)
    function = spec["function"]
    return ChatTool(function["name"], function["description"], function["parameters"])


class Case:
    """One chain: the inputs, the expected message and the flags."""

    def __init__(self, case, messages: dict, tools: dict):
        self.text = case.input
        self.inputs = ChatInputs(messages=[_message(("ident", "message_user"), messages)])
        self.expect, self.partial, self.reconstruct, self.skip = ChatMsg(), False, False, ""
        for method, args in case.calls:
            try:
                self._apply(method, args[0] if args else None, messages, tools)
            except (KeyError, ValueError, TypeError, IndexError):
                self.skip = f"{method}(...) is built in the test's code, not read here"

    def _apply(self, method: str, value, messages: dict, tools: dict) -> None:
        inputs = self.inputs
        if method == "json_schema":
            self.skip = "response_format grammars are structured outputs', not tool calls"
        elif method in ("reasoning_format", "continue_final_message", "tool_choice"):
            setattr(inputs, method, ENUMS[value[1]])
        elif method in ("enable_thinking", "add_generation_prompt", "parallel_tool_calls"):
            setattr(inputs, method, value)
        elif method == "tools":
            inputs.tools = [_tool(ref, tools) for ref in value]
        elif method == "messages":
            inputs.messages = [_message(ref, messages) for ref in value]
        elif method == "expect":
            self.expect = _message(value, messages)
        elif method == "expect_content":
            self.expect = ChatMsg(content=value, reasoning_content=self.expect.reasoning_content,
                                  tool_calls=self.expect.tool_calls)
        elif method == "expect_reasoning":
            self.expect = ChatMsg(content=self.expect.content, reasoning_content=value,
                                  tool_calls=self.expect.tool_calls)
        elif method == "expect_tool_calls":
            self.expect = ChatMsg(content=self.expect.content, tool_calls=_calls_of(value),
                                  reasoning_content=self.expect.reasoning_content)
        elif method == "is_partial":
            self.partial = value
        elif method == "expect_reconstruction":
            self.reconstruct = True
        elif method != "run":
            self.skip = f"unknown builder call {method}"


# -- comparing messages (assert_msg_equals with ignore_whitespace_differences) -----------------
def _renormalize(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), separators=(",", ":"), ensure_ascii=False)
    except ValueError:
        return ""  # a partial JSON text compares as nothing


def comparable(msg: ChatMsg) -> tuple:
    return (msg.content.strip(), msg.reasoning_content.strip(),
            [(c.name, _renormalize(c.arguments), c.id) for c in msg.tool_calls])


def accumulate(parser: ChatParser, text: str, partial_end: bool) -> ChatMsg:
    """test_peg_parser's loop: one character at a time, diffs applied to a message that
    must equal the parser's after every step."""
    content, reasoning, calls = "", "", []
    for i, char in enumerate(text):
        last = i == len(text) - 1 and not partial_end
        for diff in parser.finish(char) if last else parser.feed(char):
            content += diff.content_delta
            reasoning += diff.reasoning_content_delta
            if diff.tool_call_index >= 0:
                while len(calls) <= diff.tool_call_index:
                    calls.append(["", "", ""])
                call, delta = calls[diff.tool_call_index], diff.tool_call_delta
                call[0] = delta.name or call[0]
                call[2] = delta.id or call[2]
                call[1] += delta.arguments
        rebuilt = ChatMsg(content=content, reasoning_content=reasoning,
                          tool_calls=tuple(ToolCall(n, a, i) for n, a, i in calls))
        assert comparable(rebuilt) == comparable(parser.message), f"after {text[:i + 1]!r}"
    return rebuilt


def constrained_text(prompt, text: str) -> str | None:
    """The text the grammar sees (llama.cpp's test_peg_parser): from the first trigger that
    is not inside reasoning, or everything after the generation prompt; None when a lazy
    grammar never triggers."""
    full = prompt.generation_prompt + text
    if not prompt.grammar_lazy:
        return full
    words = [t.value for t in prompt.grammar_triggers]
    at = _first_trigger(full, words, prompt.thinking_start_tag, prompt.thinking_end_tags)
    if at is None:
        found = [full.find(w) for w in words if w in full]
        at = min(found) if found else None
    return None if at is None else full[max(at, len(prompt.generation_prompt)):]


def _first_trigger(full: str, words: list[str], start: str, ends: tuple) -> int | None:
    if not ends:
        return None
    thinking, i = False, 0
    while i < len(full):
        if not thinking and start and full.startswith(start, i):
            thinking, i = True, i + len(start)
            continue
        if thinking:
            end = next((e for e in ends if full.startswith(e, i)), None)
            thinking, i = (False, i + len(end)) if end else (True, i + 1)
            continue
        if any(full.startswith(w, i) for w in words):
            return i
        i += 1
    return None


# -- the cases ----------------------------------------------------------------------------------
def _tool_case_ids():
    try:
        cases, messages = peg_cases()
    except BaseException:  # noqa: BLE001 - absent data: the test itself skips
        return ["absent"]
    return [f"{name}@{case.line}" for case in cases for name in case.templates
            if uses_tools(case, messages)]


@pytest.mark.parametrize("case_id", _tool_case_ids())
def test_llama_cpp_tool_case(case_id):
    cases, messages = peg_cases()  # skips when the reference is absent
    name, line = case_id.rsplit("@", 1)
    case = Case(next(c for c in cases if c.line == int(line)), messages, peg_tools())
    source = template_source(name)
    if detect_specialized(source):
        pytest.skip(f"llama.cpp parses {name} with its {detect_specialized(source)} handler")
    if case.skip:
        pytest.skip(case.skip)
    templates = init_templates(source)
    prompt = prepare_chat(templates, case.inputs)
    parser = ChatParser(prompt.syntax, echo=True, tool_call_id=None)
    streamed = accumulate(parser, case.text, case.partial)
    assert comparable(streamed) == comparable(case.expect)
    if not case.partial:
        assert comparable(parser.message) == comparable(case.expect)
    _check_grammar(prompt, case, case.text)
    if case.reconstruct and not case.partial:
        _check_reconstruction(templates, prompt, case, parser.message, case.text)


def _check_grammar(prompt, case: Case, text: str) -> None:
    if not prompt.grammar:
        return
    assert grammar_error(prompt.grammar) == "", prompt.grammar
    constrained = constrained_text(prompt, text)
    if prompt.grammar_lazy and case.expect.tool_calls and not case.partial:
        assert constrained is not None, "the trigger did not fire"
    if constrained is not None and not case.partial:
        assert grammar_error(prompt.grammar, constrained) == "", prompt.grammar


def _check_reconstruction(templates, prompt, case: Case, parsed: ChatMsg, text: str) -> None:
    calls = tuple(ToolCall(c.name, p.arguments, c.id)
                  for c, p in zip(case.expect.tool_calls, parsed.tool_calls))
    message = ChatMsg(content=case.expect.content, reasoning_content=case.expect.reasoning_content,
                      tool_calls=calls)
    inputs = ChatInputs(**{**vars(case.inputs), "messages": [*case.inputs.messages, message],
                           "add_generation_prompt": False})
    rendered = prepare_chat(templates, inputs).prompt
    assert rendered.startswith(prompt.prompt + text)
