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
class ContentPart:
    """A typed content part: "text", or "media_marker" (where the server put an image)."""

    type: str
    text: str = ""


@dataclass(frozen=True)
class ChatMsg:
    """common_chat_msg. A parsed reply uses role, content, reasoning_content and
    tool_calls; a request message may instead carry `content_parts`, and a tool result its
    `tool_name` and `tool_call_id`."""

    role: str = "assistant"
    content: str = ""
    reasoning_content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    content_parts: tuple[ContentPart, ...] = ()
    tool_name: str = ""
    tool_call_id: str = ""

    def empty(self) -> bool:
        return not (self.content or self.content_parts or self.tool_calls
                    or self.reasoning_content or self.tool_name or self.tool_call_id)

    def render_content(self, delimiter: str = "\n\n") -> str:
        """The text content, typed text parts joined by `delimiter` (render_content)."""
        if self.content:
            return self.content
        return delimiter.join(p.text for p in self.content_parts if p.type == "text")

    def to_json(self) -> dict:
        """The message as a template sees it (common_chat_msg::to_json_oaicompat): content
        always present ("" when empty, a list of parts when typed), the other fields only
        when set, tool-call arguments as their JSON text."""
        message: dict = {"role": self.role}
        if self.content or not self.content_parts:
            message["content"] = self.content
        elif any(p.type == "media_marker" for p in self.content_parts):
            message["content"] = _join_with_media(self.content_parts)
        else:
            message["content"] = [{"type": p.type, "text": p.text} for p in self.content_parts]
        for key, value in (("reasoning_content", self.reasoning_content),
                           ("name", self.tool_name), ("tool_call_id", self.tool_call_id)):
            if value:
                message[key] = value
        if self.tool_calls:
            message["tool_calls"] = [_tool_call_json(call) for call in self.tool_calls]
        return message


def _join_with_media(parts: tuple[ContentPart, ...]) -> str:
    text, last_was_media = "", False
    for part in parts:
        if part.type == "media_marker":
            text, last_was_media = text + part.text, True
        elif part.type == "text":
            text += ("\n" if text and not last_was_media else "") + part.text
            last_was_media = False
    return text


def _tool_call_json(call: ToolCall) -> dict:
    out: dict = {"type": "function", "function": {"name": call.name, "arguments": call.arguments}}
    if call.id:
        out["id"] = call.id
    return out


@dataclass(frozen=True)
class MsgDiff:
    """One change: text appended to the reasoning or the content, or a tool call started
    (`tool_call_index` >= 0 with name and id) or its arguments extended."""

    reasoning_content_delta: str = ""
    content_delta: str = ""
    tool_call_index: int = -1
    tool_call_delta: ToolCall | None = None


def _suffix(prev: str, new: str, what: str) -> str:
    """string_diff: what `new` adds to `prev`. A text that shrank to a prefix of itself
    adds nothing (the last piece was a stop word that is erased in the end)."""
    if new.startswith(prev):
        return new[len(prev):]
    if prev.startswith(new):
        return ""
    raise ValueError(f"the {what} changed instead of growing: {prev[-40:]!r} -> "
                     f"{new[-40:]!r}")


def msg_diffs(prev: ChatMsg, new: ChatMsg) -> list[MsgDiff]:
    """common_chat_msg_diff::compute_diffs: reasoning first, then content, then tool calls
    (the last known one extended, the new ones whole). A message only grows while it
    streams (or loses an erased stop word); anything else is a parser bug and raises
    ValueError."""
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
