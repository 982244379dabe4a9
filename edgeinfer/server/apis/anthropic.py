"""The Anthropic Messages API (/v1/messages, /v1/messages/count_tokens) as llama-server
serves it: the request becomes an OpenAI chat-completions body (server_chat_convert_anthropic_to_oai
in tools/server/server-chat.cpp), and the outcome is rendered as a `message` or as its SSE
events (server_task_result_cmpl_final::to_json_anthropic / to_json_anthropic_stream and
server_task_result_cmpl_partial::to_json_anthropic in server-task.cpp).

llama-server's shapes, kept here: the message id is the chat-completions one (`chatcmpl-...`),
tool_use ids are the parser's tool-call ids, thinking blocks carry an empty signature, a stop
sequence ends the turn with stop_reason "end_turn" and `stop_sequence` set, and errors use the
OpenAI envelope (inside a stream: an `error` event whose data is the bare error object).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

from edgeinfer.chat.message import ChatMsg, MsgDiff, ToolCall, msg_diffs
from edgeinfer.server.apis import ChatMeta, ChatOutcome, sse_frame
from edgeinfer.server.errors import ApiError, bad_request

DEFAULT_MAX_TOKENS = 4096  # "required in Anthropic, but we're permissive"
DEFAULT_THINKING_BUDGET = 10000
PASSED_THROUGH = ("temperature", "top_p", "top_k", "stream", "chat_template_kwargs")
BILLING_HEADER = "x-anthropic-billing-header:"
# what llama-server answers (HTTP 500) when a converted image part meets a model without mmproj
IMAGE_UNSUPPORTED = ("image input is not supported - hint: if this is unexpected, you may need "
                     "to provide the mmproj")


# -- request ---------------------------------------------------------------------------------
def _get(obj: Any, key: str, default: Any = None) -> Any:
    """llama-server's json_value for any JSON: the value unless absent or null."""
    value = obj.get(key) if isinstance(obj, dict) else None
    return default if value is None else value


def _str(obj: Any, key: str, default: str = "") -> str:
    """json_value<std::string>: a value of another type falls back to the default."""
    value = _get(obj, key)
    return value if isinstance(value, str) else default


def _int(obj: Any, key: str, default: int) -> int:
    """json_value<int>: numbers truncate toward zero (nlohmann's get<int>), others default."""
    value = _get(obj, key)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return int(value)
    return default


def _dump(value: Any) -> str:
    """nlohmann's dump(): compact, UTF-8 kept."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def normalize_billing_header(text: str) -> str:
    """normalize_anthropic_billing_header: Claude Code's system prompt starts with
    `x-anthropic-billing-header: ...; cch=ab12c;` whose 5-character cch stamp changes on
    every request and so defeats prefix caching; it becomes `cch=fffff`. Any other text is
    kept as is (so is a header whose stamp is not 5 characters followed by ';')."""
    if not text.startswith(BILLING_HEADER):
        return text
    at = text.find("cch=", len(BILLING_HEADER))
    if at < 0:
        return text
    start = at + 4
    if start + 5 < len(text) and text[start + 5] == ";":
        return text[:start] + "fffff" + text[start + 5:]
    return text


def _system_message(system: Any) -> dict:
    """The system prompt, a string or text blocks joined with nothing between them."""
    if isinstance(system, str):
        content = normalize_billing_header(system)
    elif isinstance(system, list):
        content = "".join(normalize_billing_header(_str(block, "text")) for block in system
                          if _str(block, "type") == "text")
    else:  # another type still gives an (empty) system message
        content = ""
    return {"role": "system", "content": content}


def _image_part(block: Any) -> dict | None:
    """An image block's source as an OpenAI image_url part; other source types are dropped."""
    source = _get(block, "source", {})
    kind = _str(source, "type")
    if kind == "base64":
        url = f"data:{_str(source, 'media_type', 'image/jpeg')};base64,{_str(source, 'data')}"
    elif kind == "url":
        url = _str(source, "url")
    else:
        return None
    return {"type": "image_url", "image_url": {"url": url}}


def _tool_message(block: dict) -> dict:
    """A tool_result block as an OpenAI tool message: text parts joined into a string, or
    the parts themselves when an image is among them. `is_error` is not carried."""
    result = _get(block, "content")
    if isinstance(result, str):
        content: Any = result
    elif isinstance(result, list):
        text, parts, has_images = "", [], False
        for item in result:
            kind = _str(item, "type")
            if kind == "text":
                text += _str(item, "text")
                parts.append({"type": "text", "text": _str(item, "text")})
            elif kind == "image":
                has_images = True
                part = _image_part(item)
                if part is not None:
                    parts.append(part)
        content = parts if has_images else text
    else:
        content = ""
    return {"role": "tool", "tool_call_id": _str(block, "tool_use_id"), "content": content}


def _tool_call(block: dict) -> dict:
    return {"id": _str(block, "id"), "type": "function",
            "function": {"name": _str(block, "name"),
                         "arguments": _dump(_get(block, "input", {}))}}


def _convert_blocks(role: str, blocks: list) -> list[dict]:
    """One message's content blocks: text and images stay in the message, thinking becomes
    its reasoning_content, tool_use its tool_calls, and each tool_result a tool message after
    it. Unknown block types are dropped; a message left with nothing is dropped too."""
    content, tool_calls, tool_messages, reasoning = [], [], [], ""
    for block in blocks:
        kind = _str(block, "type")
        if kind == "text":
            content.append(block)
        elif kind == "thinking":
            reasoning += _str(block, "thinking")
        elif kind == "image":
            part = _image_part(block)
            if part is not None:
                content.append(part)
        elif kind == "tool_use":
            tool_calls.append(_tool_call(block))
        elif kind == "tool_result":
            tool_messages.append(_tool_message(block))
    if not (content or tool_calls or reasoning):
        return tool_messages
    message: dict = {"role": role, "content": content or ""}
    if tool_calls:
        message["tool_calls"] = tool_calls
    if reasoning:
        message["reasoning_content"] = reasoning
    return [message, *tool_messages]


def _convert_message(message: Any) -> list[dict]:
    """Messages whose content is not an array pass through untouched (the chat path checks
    them); an assistant message without content is dropped."""
    role = _str(message, "role")
    if not isinstance(message, dict) or "content" not in message:
        return [] if role == "assistant" else [message]
    if not isinstance(message["content"], list):
        return [message]
    return _convert_blocks(role, message["content"])


def _tools(tools: list) -> list[dict]:
    return [{"type": "function",
             "function": {"name": _str(tool, "name"), "description": _str(tool, "description"),
                          "parameters": tool["input_schema"]
                          if isinstance(tool, dict) and "input_schema" in tool else {}}}
            for tool in tools]


def _tool_choice(choice: Any) -> str | None:
    """auto -> "auto"; any and tool (whatever its name) -> "required"; none is not mapped."""
    kind = _str(choice, "type")
    return {"auto": "auto", "any": "required", "tool": "required"}.get(kind)


def _options(body: dict, oai: dict) -> None:
    """Everything but the messages, in server_chat_convert_anthropic_to_oai's order."""
    if isinstance(body.get("tools"), list):
        oai["tools"] = _tools(body["tools"])
    if isinstance(body.get("tool_choice"), dict):
        choice = _tool_choice(body["tool_choice"])
        if choice is not None:
            oai["tool_choice"] = choice
    if "stop_sequences" in body:
        oai["stop"] = body["stop_sequences"]
    oai["max_tokens"] = body["max_tokens"] if "max_tokens" in body else DEFAULT_MAX_TOKENS
    for key in PASSED_THROUGH:
        if key in body:
            oai[key] = body[key]
    if "thinking" in body:
        thinking = _get(body, "thinking", {})
        if _str(thinking, "type") == "enabled":  # "disabled" changes nothing
            oai["thinking_budget_tokens"] = _int(thinking, "budget_tokens",
                                                 DEFAULT_THINKING_BUDGET)
    if "metadata" in body:
        user_id = _str(_get(body, "metadata", {}), "user_id")
        if user_id:
            oai["__metadata_user_id"] = user_id


def convert_request(body: Any) -> dict:
    """server_chat_convert_anthropic_to_oai, image parts included. Like llama-server it
    refuses only a missing `messages` and tolerates other wrong types (a field of the wrong
    type counts as absent); it also refuses a `messages` that is not an array, which
    llama-server would silently treat as an empty conversation."""
    if not isinstance(body, dict) or "messages" not in body:
        raise bad_request("'messages' is required")  # llama-server: the same text, as a 500
    if not isinstance(body["messages"], list):
        raise bad_request("Expected 'messages' to be an array")  # its chat path's words
    messages = [] if body.get("system") is None else [_system_message(body["system"])]
    for message in body["messages"]:
        messages += _convert_message(message)
    oai: dict = {"messages": messages}
    _options(body, oai)
    return oai


def _has_image(message: Any) -> bool:
    content = message.get("content") if isinstance(message, dict) else None
    return isinstance(content, list) and any(
        isinstance(part, dict) and part.get("type") == "image_url" for part in content)


def to_chat_body(body: Any) -> dict:
    """The request as an OpenAI chat-completions body. This server reads no images: a
    request that carries one is answered as llama-server answers it for a model without
    mmproj (oaicompat_content_load_media: HTTP 500, IMAGE_UNSUPPORTED)."""
    oai = convert_request(body)
    if any(_has_image(message) for message in oai["messages"]):
        raise ApiError(500, IMAGE_UNSUPPORTED)
    return oai


def count_tokens_reply(n_tokens: int) -> dict:
    """/v1/messages/count_tokens: the prompt's token count and nothing else (handle_count_tokens
    adds "object" only on the OpenAI routes)."""
    return {"input_tokens": n_tokens}


# -- reply -----------------------------------------------------------------------------------
def stop_reason(outcome: ChatOutcome) -> str:
    """llama-server's rule: a stop word or end of generation ends the turn (with tool calls,
    for tool use); anything else (the token or context limit) is max_tokens."""
    if outcome.finish_reason == "length":
        return "max_tokens"
    return "tool_use" if outcome.message.tool_calls else "end_turn"


def _tool_input(arguments: str) -> Any:
    """The arguments as JSON; text that does not parse (nlohmann has no NaN) gives {}."""
    def refuse(name: str) -> Any:
        raise ValueError(name)
    try:
        return json.loads(arguments, parse_constant=refuse)
    except ValueError:
        return {}


def content_blocks(msg: ChatMsg) -> list[dict]:
    """thinking, then text, then one tool_use per call; empty parts give no block."""
    blocks = []
    if msg.reasoning_content:
        blocks.append({"type": "thinking", "thinking": msg.reasoning_content, "signature": ""})
    if msg.content:
        blocks.append({"type": "text", "text": msg.content})
    for call in msg.tool_calls:
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name,
                       "input": _tool_input(call.arguments)})
    return blocks


def _usage(n_prompt: int, n_cached: int, n_decoded: int) -> dict:
    """input_tokens counts only the prompt tokens evaluated, the cached ones apart."""
    return {"cache_read_input_tokens": n_cached, "input_tokens": n_prompt - n_cached,
            "output_tokens": n_decoded}


def _apply(msg: ChatMsg, diffs: list[MsgDiff]) -> ChatMsg:
    """The message the diffs build (the inverse of msg_diffs)."""
    calls = list(msg.tool_calls)
    reasoning, content = msg.reasoning_content, msg.content
    for diff in diffs:
        reasoning += diff.reasoning_content_delta
        content += diff.content_delta
        delta = diff.tool_call_delta
        if diff.tool_call_index < 0 or delta is None:
            continue
        if diff.tool_call_index == len(calls):
            calls.append(delta)
            continue
        old = calls[diff.tool_call_index]
        name, id_ = (delta.name, delta.id) if delta.name or delta.id else (old.name, old.id)
        calls[diff.tool_call_index] = ToolCall(name, old.arguments + delta.arguments, id_)
    return replace(msg, reasoning_content=reasoning, content=content, tool_calls=tuple(calls))


def _event(data: dict) -> str:
    """One frame of format_anthropic_sse: the event name is the data's type."""
    return sse_frame(data, event=data["type"])


def _block_start(index: int, block: dict) -> str:
    return _event({"type": "content_block_start", "index": index, "content_block": block})


def _block_delta(index: int, delta: dict) -> str:
    return _event({"type": "content_block_delta", "index": index, "delta": delta})


def _block_stop(index: int) -> str:
    return _event({"type": "content_block_stop", "index": index})


class AnthropicReply:
    """One /v1/messages reply. For a stream: `start` with the first generated token,
    `update` with each token's diffs, `end` with the outcome (it renders the final parse's
    own diffs), or `error`. Blocks are numbered thinking (0), text (0 or 1), then one per
    tool call, as llama-server numbers them."""

    def __init__(self, meta: ChatMeta, request: dict) -> None:
        self.meta = meta
        self.request = request  # nothing of it is echoed: the model is the server's name
        self._msg = ChatMsg()  # what the updates have built so far
        self._thinking_started = False
        self._text_started = False
        self._tools_started: set[int] = set()

    def reply(self, outcome: ChatOutcome) -> dict:
        """server_task_result_cmpl_final::to_json_anthropic."""
        return {"id": self.meta.id, "type": "message", "role": "assistant",
                "content": content_blocks(outcome.message), "model": self.meta.model,
                "stop_reason": stop_reason(outcome),
                "stop_sequence": outcome.stopping_word or None,
                "usage": _usage(outcome.n_prompt, outcome.n_cached, outcome.n_decoded)}

    def start(self, n_prompt: int, n_cached: int) -> list[str]:
        """message_start, which llama-server sends with the first generated token's events
        (the partial result whose n_decoded is 1), once the prompt's cache use is known."""
        message = {"id": self.meta.id, "type": "message", "role": "assistant", "content": [],
                   "model": self.meta.model, "stop_reason": None, "stop_sequence": None,
                   "usage": _usage(n_prompt, n_cached, 0)}
        return [_event({"type": "message_start", "message": message})]

    def update(self, diffs: list[MsgDiff]) -> list[str]:
        """server_task_result_cmpl_partial::to_json_anthropic: a block starts with its first
        delta. The text block's index counts reasoning seen so far, this chunk's included;
        a tool call's counts the text block only once it has started."""
        self._msg = _apply(self._msg, diffs)
        has_reasoning = bool(self._msg.reasoning_content)
        frames = []
        for diff in diffs:
            frames += self._thinking_frames(diff) + self._text_frames(diff, has_reasoning)
            if diff.tool_call_index >= 0 and diff.tool_call_delta is not None:
                index = int(has_reasoning) + int(self._text_started) + diff.tool_call_index
                delta = diff.tool_call_delta
                if delta.name:  # a new call, or one whose name or id changed: a new start
                    frames.append(_block_start(index, _tool_use(delta)))
                    self._tools_started.add(diff.tool_call_index)
                frames += _arguments_frames(index, delta)
        return frames

    def end(self, outcome: ChatOutcome) -> list[str]:
        """server_task_result_cmpl_final::to_json_anthropic_stream: the diffs of the final
        parse, each block's stop (the thinking block after an empty signature_delta), then
        message_delta and message_stop.

        One difference: llama-server forgets here which blocks the partial results started,
        so a final diff to text or to a started tool call repeats its content_block_start;
        this sends each start once."""
        msg = outcome.message
        has_thinking, n_text = bool(msg.reasoning_content), int(bool(msg.content))
        frames = []
        for diff in msg_diffs(self._msg, msg):
            frames += self._thinking_frames(diff) + self._text_frames(diff, has_thinking)
            i = diff.tool_call_index
            if i >= 0 and diff.tool_call_delta is not None:
                index = int(has_thinking) + n_text + i
                if i not in self._tools_started:
                    frames.append(_block_start(index, _tool_use(msg.tool_calls[i])))
                    self._tools_started.add(i)
                frames += _arguments_frames(index, diff.tool_call_delta)
        self._msg = msg
        return frames + _closing_frames(outcome, has_thinking, n_text)

    def error(self, body: dict) -> list[str]:
        """An error after the stream began: `event: error` with the bare error object (the
        inside of ApiError.body()'s envelope), after which the stream ends."""
        error = body["error"] if isinstance(body.get("error"), dict) else body
        return [sse_frame(error, event="error")]

    def _thinking_frames(self, diff: MsgDiff) -> list[str]:
        if not diff.reasoning_content_delta:
            return []
        frames = []
        if not self._thinking_started:
            frames.append(_block_start(0, {"type": "thinking", "thinking": ""}))
            self._thinking_started = True
        delta = {"type": "thinking_delta", "thinking": diff.reasoning_content_delta}
        return frames + [_block_delta(0, delta)]

    def _text_frames(self, diff: MsgDiff, has_reasoning: bool) -> list[str]:
        if not diff.content_delta:
            return []
        index, frames = int(has_reasoning), []
        if not self._text_started:
            frames.append(_block_start(index, {"type": "text", "text": ""}))
            self._text_started = True
        return frames + [_block_delta(index, {"type": "text_delta", "text": diff.content_delta})]


def _tool_use(call: ToolCall) -> dict:
    """A tool_use block's start: no input yet (llama-server sends none), it streams."""
    return {"type": "tool_use", "id": call.id, "name": call.name}


def _arguments_frames(index: int, delta: ToolCall) -> list[str]:
    if not delta.arguments:
        return []
    return [_block_delta(index, {"type": "input_json_delta", "partial_json": delta.arguments})]


def _closing_frames(outcome: ChatOutcome, has_thinking: bool, n_text: int) -> list[str]:
    frames = []
    if has_thinking:  # Anthropic's clients expect a signature; a local model has none
        frames += [_block_delta(0, {"type": "signature_delta", "signature": ""}),
                   _block_stop(0)]
    if n_text:
        frames.append(_block_stop(int(has_thinking)))
    first_tool = int(has_thinking) + n_text
    frames += [_block_stop(first_tool + i) for i in range(len(outcome.message.tool_calls))]
    delta = {"stop_reason": stop_reason(outcome), "stop_sequence": outcome.stopping_word or None}
    frames.append(_event({"type": "message_delta", "delta": delta,
                          "usage": {"output_tokens": outcome.n_decoded}}))
    return frames + [_event({"type": "message_stop"})]
