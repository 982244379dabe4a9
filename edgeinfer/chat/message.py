"""The assistant message parsed from generated text, and the diffs a stream sends.

llama.cpp's common_chat_msg and common_chat_msg_diff (common/chat.h): a parser turns the text
generated so far into a `ChatMsg` (visible content, reasoning, tool calls); a stream sends
what changed since the previous message as `MsgDiff`s, which every API (OpenAI chat,
Anthropic Messages, OpenAI Responses) renders in its own event shapes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ToolCall:
    """One function call; `arguments` is the JSON text as generated (OpenAI's form)."""

    name: str = ""
    arguments: str = ""
    id: str = ""


@dataclass(frozen=True)
class ChatMsg:
    role: str = "assistant"
    content: str = ""
    reasoning_content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True)
class MsgDiff:
    """One change: text appended to the reasoning or the content, or a tool call started
    (`tool_call_index` >= 0 with name and id) or its arguments extended."""

    reasoning_content_delta: str = ""
    content_delta: str = ""
    tool_call_index: int = -1
    tool_call_delta: ToolCall | None = None


def _suffix(prev: str, new: str, what: str) -> str:
    """llama.cpp's string_diff: what `new` adds to `prev`; "" when `new` is shorter (a held
    partial stop word was dropped at the end)."""
    if new.startswith(prev):
        return new[len(prev):]
    if prev.startswith(new):
        return ""
    raise ValueError(f"the {what} changed instead of growing: {prev[-40:]!r} -> "
                     f"{new[-40:]!r}")


def msg_diffs(prev: ChatMsg, new: ChatMsg) -> list[MsgDiff]:
    """common_chat_msg_diff::compute_diffs: reasoning first, then content, then tool calls
    (the last known one extended, the new ones whole). A message only grows while it
    streams (or loses a held partial stop word at the end); anything else is a parser bug
    and raises ValueError."""
    diffs = []
    if prev.reasoning_content != new.reasoning_content:
        delta = _suffix(prev.reasoning_content, new.reasoning_content, "reasoning")
        diffs.append(MsgDiff(reasoning_content_delta=delta))
    if prev.content != new.content:
        diffs.append(MsgDiff(content_delta=_suffix(prev.content, new.content, "content")))
    if len(new.tool_calls) < len(prev.tool_calls):
        raise ValueError("tool calls disappeared from a streamed message")
    if prev.tool_calls:  # the last known call: its name may still grow, its id appear
        i = len(prev.tool_calls) - 1
        old, cur = prev.tool_calls[i], new.tool_calls[i]
        if old.name and cur.name and not cur.name.startswith(old.name):
            raise ValueError(f"a streamed tool call changed its name: {old.name!r} -> "
                             f"{cur.name!r}")
        args = _suffix(old.arguments, cur.arguments, "tool call arguments")
        renamed = old.id != cur.id or old.name != cur.name
        if args or renamed:
            delta = ToolCall(cur.name, args, cur.id) if renamed else ToolCall(arguments=args)
            diffs.append(MsgDiff(tool_call_index=i, tool_call_delta=delta))
    for i in range(len(prev.tool_calls), len(new.tool_calls)):
        diffs.append(MsgDiff(tool_call_index=i, tool_call_delta=new.tool_calls[i]))
    return diffs
