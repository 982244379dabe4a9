"""From the parse tree to the message: llama.cpp's common_chat_peg_mapper
(common/chat-peg-parser.cpp).

The grammar tags what it reads; the tags are visited in order (pre-order) and build the
message. Reasoning and content nodes are concatenated. A tool call starts at a `tool-open`
node and is added to the message as soon as its name is known (so a stream can show it);
its arguments are either a JSON object (`tool-args`, the raw text as generated, growing
while it streams) or built from tagged arguments (`tool-arg-name` and `tool-arg-value`
nodes become `"name":value` members, string values quoted and escaped). At `tool-close`
open strings and braces are closed. A call whose name never appears is dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from edgeinfer.chat import peg
from edgeinfer.chat.message import ChatMsg, ToolCall

REASONING, CONTENT = "reasoning", "content"
TOOL_OPEN, TOOL_CLOSE, TOOL_ID, TOOL_NAME, TOOL_ARGS = (
    "tool-open", "tool-close", "tool-id", "tool-name", "tool-args")
TOOL_ARG_OPEN, TOOL_ARG_CLOSE, TOOL_ARG_NAME = "tool-arg-open", "tool-arg-close", "tool-arg-name"
TOOL_ARG_VALUE, TOOL_ARG_STRING_VALUE = "tool-arg-value", "tool-arg-string-value"

_SPACE = " \t\n\r\v\f"


@dataclass
class _Call:
    name: str = ""
    arguments: str = ""
    id: str = ""


@dataclass
class _State:
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: list[_Call] = field(default_factory=list)
    pending: _Call | None = None  # opened, name not seen yet
    current: _Call | None = None
    arg_count: int = 0
    closing_quote: bool = False
    args_buffer: str = ""  # arguments seen before the name

    def args_target(self) -> str:
        return "current" if self.current is not None and self.current.name else "buffer"

    def add_args(self, text: str) -> None:
        if self.args_target() == "current":
            self.current.arguments += text
        else:
            self.args_buffer += text

    def set_args(self, text: str) -> None:
        if self.args_target() == "current":
            self.current.arguments = text
        else:
            self.args_buffer = text

    def args(self) -> str:
        return self.current.arguments if self.args_target() == "current" else self.args_buffer


def message_from_tree(result: peg.Result) -> ChatMsg:
    """common_chat_peg_mapper::from_ast."""
    state = _State()
    for node in peg.walk(result.nodes):
        _map(state, node)
    if state.pending is not None and state.pending.name:  # a call cut before it closed
        if state.args_buffer:
            state.pending.arguments = state.args_buffer
        if state.closing_quote and state.pending.arguments:
            state.pending.arguments += '"'
        state.calls.append(state.pending)
    reasoning = "".join(state.reasoning)
    if not reasoning.strip(" \n\r\t"):  # an empty <think></think>
        reasoning = ""
    calls = tuple(ToolCall(c.name, c.arguments, c.id) for c in state.calls)
    return ChatMsg(content="".join(state.content), reasoning_content=reasoning, tool_calls=calls)


def _map(state: _State, node: peg.Node) -> None:
    handler = _HANDLERS.get(node.tag)
    if handler is not None:
        handler(state, node.text)


def _reasoning(state: _State, text: str) -> None:
    state.reasoning.append(text)


def _content(state: _State, text: str) -> None:
    state.content.append(text)


def _tool_open(state: _State, text: str) -> None:
    state.pending = state.current = _Call()
    state.arg_count, state.args_buffer, state.closing_quote = 0, "", False


def _tool_id(state: _State, text: str) -> None:
    if state.current is None:
        return
    text = text.rstrip(_SPACE)
    if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
        text = text[1:-1]
    state.current.id = text


def _tool_name(state: _State, text: str) -> None:
    call = state.current
    if call is None:
        return
    call.name = text.rstrip(_SPACE)
    if state.args_buffer:
        call.arguments, state.args_buffer = state.args_buffer, ""
    elif not call.arguments:
        call.arguments = "{"
    if state.pending is not None:  # the call is known: streams may show it now
        state.calls.append(state.pending)
        state.pending = None


def _tool_args(state: _State, text: str) -> None:
    if state.current is None:
        return
    text = text.rstrip(_SPACE)
    if text.startswith("{"):
        state.set_args(text)


def _arg_open(state: _State, text: str) -> None:
    state.closing_quote = False


def _arg_name(state: _State, text: str) -> None:
    if state.current is None:
        return
    name = json.dumps(_trim_one(text), ensure_ascii=False)
    entry = ("," if state.arg_count > 0 else "") + name + ":"
    state.arg_count += 1
    if not state.args():
        state.set_args("{")
    state.add_args(entry)


def _trim_one(text: str) -> str:
    """One leading whitespace character and all trailing ones go (the C++ `trim`)."""
    if text and text[0] in _SPACE:
        text = text[1:]
    return text.rstrip(_SPACE)


def _arg_value(state: _State, text: str) -> None:
    if state.current is not None and text:
        state.add_args(normalize_quotes_to_json(text))


def _arg_string_value(state: _State, text: str) -> None:
    """A value the schema says is a string: always quoted, closed at tool-arg-close."""
    if state.current is None:
        return
    added = ""
    if not state.closing_quote:
        added, state.closing_quote = '"', True
    state.add_args(added + json.dumps(text, ensure_ascii=False)[1:-1])


def _arg_close(state: _State, text: str) -> None:
    if state.current is not None and state.closing_quote:
        state.add_args('"')
        state.closing_quote = False


def _tool_close(state: _State, text: str) -> None:
    call = state.current
    if call is None:
        return
    if not call.name and state.args_buffer:
        call.arguments, state.args_buffer = state.args_buffer, ""
    if state.closing_quote:
        call.arguments += '"'
        state.closing_quote = False
    call.arguments += "}" * max(0, json_brace_depth(call.arguments))
    if state.pending is not None:
        if call.name:
            state.calls.append(state.pending)
        state.pending = None


_HANDLERS = {
    REASONING: _reasoning, CONTENT: _content, TOOL_OPEN: _tool_open, TOOL_ID: _tool_id,
    TOOL_NAME: _tool_name, TOOL_ARGS: _tool_args, TOOL_ARG_OPEN: _arg_open,
    TOOL_ARG_NAME: _arg_name, TOOL_ARG_VALUE: _arg_value,
    TOOL_ARG_STRING_VALUE: _arg_string_value, TOOL_ARG_CLOSE: _arg_close,
    TOOL_CLOSE: _tool_close,
}


def json_brace_depth(text: str) -> int:
    """Unclosed `{` outside strings."""
    depth, in_string, escaped = 0, False, False
    for char in text:
        if escaped:
            escaped = False
        elif char == "\\" and in_string:
            escaped = True
        elif char == '"':
            in_string = not in_string
        elif not in_string and char in "{}":
            depth += 1 if char == "{" else -1
    return depth


_PY_LITERALS = (("True", "true"), ("False", "false"), ("None", "null"))


def normalize_quotes_to_json(text: str) -> str:
    """A Python-style value as JSON: single-quoted strings double-quoted (escapes adjusted),
    True/False/None as JSON literals, prefixes of those too so a stream stays monotonic
    (normalize_quotes_to_json)."""
    out, i, single, double = [], 0, False, False
    while i < len(text):
        char = text[i]
        if char == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if single and nxt == "'":
                out.append("'")
            elif single and nxt == '"':
                out.append('\\"')
            elif single or double:
                out.append(char + nxt)
            else:
                out.append(char)
                i += 1
                continue
            i += 2
            continue
        if char == '"':
            out.append('\\"' if single else '"')
            double = double if single else not double
        elif char == "'":
            if double:
                out.append("'")
            else:
                single = not single
                out.append('"')
        elif not single and not double and char in "TFN" and not _word_char(text, i - 1):
            i = _python_literal(text, i, out)
            continue
        else:
            out.append(char)
        i += 1
    return "".join(out)


def _word_char(text: str, at: int) -> bool:
    return at >= 0 and (text[at].isalnum() or text[at] == "_")


def _python_literal(text: str, i: int, out: list[str]) -> int:
    end = i
    while end < len(text) and (text[end].isalnum() or text[end] == "_"):
        end += 1
    word = text[i:end]
    for py, js in _PY_LITERALS:
        if py[:len(word)] == word:
            out.append(js[:len(word)])
            return end
    out.append(text[i])
    return i + 1


def with_ids(message: ChatMsg, ids: list[str], new_id) -> ChatMsg:
    """common_chat_msg::set_tool_call_ids: each call keeps the id it first had, the one it
    was generated with or else a new one from `new_id()`, for the whole stream."""
    calls = []
    for i, call in enumerate(message.tool_calls):
        if len(ids) <= i:
            ids.append(call.id or new_id())
        calls.append(replace(call, id=ids[i]))
    return replace(message, tool_calls=tuple(calls))
