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
from typing import Any

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
