"""From an OpenAI chat request to ChatInputs, as llama-server reads one.

`ChatSettings` is what llama-server's flags fix (server_chat_params: --jinja, --reasoning,
--reasoning-format, --chat-template-kwargs, --prefill-assistant, ...); `chat_inputs` reads
the request fields that concern the template (oaicompat_chat_params_parse in
tools/server/server-common.cpp and common_chat_msgs_parse_oaicompat in common/chat.cpp),
with llama.cpp's error messages. The server still handles sampling fields, response_format
and media.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from edgeinfer.chat.message import ChatMsg, ContentPart, ToolCall
from edgeinfer.chat.prompt import (
    ChatInputs,
    ChatPrompt,
    ChatTemplates,
    ChatTool,
    prepare_chat,
    supports_enable_thinking,
)
from edgeinfer.chat.render import (
    CONTINUE_AUTO,
    CONTINUE_CONTENT,
    CONTINUE_NONE,
    CONTINUE_REASONING,
)
from edgeinfer.errors import EdgeInferError

TOOL_CHOICES = ("auto", "none", "required")


class ChatRequestError(EdgeInferError):
    """The request is malformed: llama-server answers 400 with this message."""


@dataclass(frozen=True)
class ChatSettings:
    """The server-wide chat settings (llama-server's server_chat_params).

    `chat_template_kwargs` holds decoded values; `enable_thinking` is the server default,
    true when --reasoning is not off and the template has reasoning markers."""

    use_jinja: bool = True
    prefill_assistant: bool = True
    reasoning_format: str = "deepseek"
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    enable_thinking: bool = False
    force_pure_content: bool = False


def chat_settings(templates: ChatTemplates, *, use_jinja: bool = True, reasoning: str = "auto",
                  reasoning_format: str = "deepseek",
                  chat_template_kwargs: dict[str, Any] | None = None,
                  reasoning_preserve: bool | None = None, reasoning_effort: str = "default",
                  prefill_assistant: bool = True,
                  skip_chat_parsing: bool = False) -> ChatSettings:
    """The settings llama-server derives from its flags (common/arg.cpp, server-context.cpp):
    --reasoning on|off sets the enable_thinking kwarg, --reasoning-effort and
    --[no-]reasoning-preserve set theirs (preserve_reasoning defaults to true), and thinking
    is on by default unless --reasoning off or the template has no reasoning markers."""
    kwargs = dict(chat_template_kwargs or {})
    if reasoning in ("on", "enabled", "true", "1"):
        kwargs["enable_thinking"] = True
    elif reasoning in ("off", "disabled", "false", "0"):
        kwargs["enable_thinking"] = False
    elif reasoning not in ("auto", "-1"):
        raise ChatRequestError(f"error: unknown value for --reasoning: '{reasoning}'")
    if reasoning_effort != "default":
        kwargs["reasoning_effort"] = reasoning_effort
    if reasoning_preserve is not None:
        kwargs["preserve_reasoning"] = reasoning_preserve
    kwargs.setdefault("preserve_reasoning", True)
    thinking = reasoning not in ("off", "disabled", "false", "0") and use_jinja \
        and supports_enable_thinking(templates)
    return ChatSettings(use_jinja, prefill_assistant, reasoning_format, kwargs, thinking,
                        skip_chat_parsing)


# -- messages and tools (common_chat_msgs_parse_oaicompat, common_chat_tools_parse_oaicompat) --
def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _content_parts(content: list) -> tuple[ContentPart, ...]:
    parts = []
    for part in content:
        if not isinstance(part, dict) or "type" not in part:
            raise ValueError(f"Missing content part type: {_dump(part)}")
        if part["type"] not in ("text", "media_marker"):
            raise ValueError(f"Unsupported content part type: {_dump(part['type'])}")
        if not isinstance(part.get("text"), str):
            raise ValueError(f"Missing content part text: {_dump(part)}")
        parts.append(ContentPart(part["type"], part["text"]))
    return tuple(parts)


def _tool_calls(calls: Any) -> tuple[ToolCall, ...]:
    out = []
    for call in calls if isinstance(calls, list) else []:
        if not isinstance(call, dict) or "type" not in call:
            raise ValueError(f"Missing tool call type: {_dump(call)}")
        if call["type"] != "function":
            raise ValueError(f"Unsupported tool call type: {_dump(call)}")
        function = call.get("function")
        if not isinstance(function, dict):
            raise ValueError(f"Missing tool call function: {_dump(call)}")
        if not isinstance(function.get("name"), str):
            raise ValueError(f"Missing tool call name: {_dump(call)}")
        args = function.get("arguments")
        args = args if isinstance(args, str) else _dump(args)
        out.append(ToolCall(function["name"], args, str(call.get("id") or "")))
    return tuple(out)


def _message(message: Any) -> ChatMsg:
    if not isinstance(message, dict):
        raise ValueError(f"Expected 'message' to be an object, got {_dump(message)}")
    if not isinstance(message.get("role"), str):
        raise ValueError(f"Missing 'role' in message: {_dump(message)}")
    if "content" not in message and "tool_calls" not in message:
        raise ValueError("Expected 'content' or 'tool_calls' (ref: https://github.com/ggml-org/"
                         "llama.cpp/issues/8367 & https://github.com/ggml-org/llama.cpp/"
                         "issues/12279)")
    content, parts = message.get("content"), ()
    if isinstance(content, list):
        content, parts = "", _content_parts(content)
    elif content is not None and not isinstance(content, str):
        raise ValueError(f"Invalid 'content' type: expected string or array, got "
                         f"{_dump(content)} (ref: https://github.com/ggml-org/llama.cpp/"
                         "issues/8367)")

    def text(key: str) -> str:
        value = message.get(key)
        return value if isinstance(value, str) else ""

    return ChatMsg(role=message["role"], content=content or "", content_parts=parts,
                   tool_calls=_tool_calls(message.get("tool_calls")),
                   reasoning_content=text("reasoning_content"), tool_name=text("name"),
                   tool_call_id=text("tool_call_id"))


def messages_from_json(messages: Any) -> list[ChatMsg]:
    """common_chat_msgs_parse_oaicompat."""
    try:
        if not isinstance(messages, list):
            raise ValueError(f"Expected 'messages' to be an array, got {_dump(messages)}")
        return [_message(m) for m in messages]
    except ValueError as exc:
        raise ChatRequestError(f"Failed to parse messages: {exc}") from exc


def tools_from_json(tools: Any) -> list[ChatTool]:
    """common_chat_tools_parse_oaicompat: OpenAI "function" tools; null is none."""
    if tools is None:
        return []
    try:
        if not isinstance(tools, list):
            raise ValueError(f"Expected 'tools' to be an array, got {_dump(tools)}")
        out = []
        for tool in tools:
            if not isinstance(tool, dict) or "type" not in tool:
                raise ValueError(f"Missing tool type: {_dump(tool)}")
            if tool["type"] != "function":
                raise ValueError(f"Unsupported tool type: {_dump(tool)}")
            function = tool.get("function")
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise ValueError(f"Missing tool function: {_dump(tool)}")
            out.append(ChatTool(function["name"], str(function.get("description", "")),
                                function.get("parameters", {})))
        return out
    except ValueError as exc:
        raise ChatRequestError(f"Failed to parse tools: {exc}") from exc


def continuation_from_json(value: Any) -> str:
    """common_chat_continuation_parse: true, "reasoning_content" or "content"."""
    if value is True:
        return CONTINUE_AUTO
    return {"reasoning_content": CONTINUE_REASONING, "content": CONTINUE_CONTENT}.get(
        value if isinstance(value, str) else "", CONTINUE_NONE)


# -- the request --------------------------------------------------------------------------------
def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list):
        raise ChatRequestError("Expected 'messages' to be an array")
    for message in messages:
        role = message.get("role") if isinstance(message, dict) else None
        if not isinstance(message, dict) or (role != "assistant" and "content" not in message):
            raise ChatRequestError("All non-assistant messages must contain 'content'")
        if role == "assistant" and "content" not in message and "tool_calls" not in message:
            raise ChatRequestError("Assistant message must contain either 'content' or "
                                   "'tool_calls'!")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise ChatRequestError("Expected 'content' to be a string or an array")


def _continuation(body: dict, inputs: ChatInputs, settings: ChatSettings) -> bool:
    """Sets inputs' continuation; true when it came from the trailing-assistant heuristic
    (--prefill-assistant), which llama.cpp streams as generated text."""
    inputs.continue_final_message = continuation_from_json(body.get("continue_final_message")) \
        if "continue_final_message" in body else CONTINUE_NONE
    heuristic = False
    messages = inputs.messages
    if inputs.continue_final_message == CONTINUE_NONE and settings.prefill_assistant \
            and messages and messages[-1].role == "assistant":
        if len(messages) >= 2 and messages[-2].role == "assistant":
            raise ChatRequestError("Cannot have 2 or more assistant messages at the end of the "
                                   "list.")
        inputs.continue_final_message, inputs.add_generation_prompt = CONTINUE_AUTO, False
        heuristic = True
    if inputs.continue_final_message != CONTINUE_NONE and inputs.add_generation_prompt:
        raise ChatRequestError("Cannot set both add_generation_prompt and "
                               "continue_final_message to true.")
    if inputs.continue_final_message != CONTINUE_NONE and messages \
            and messages[-1].role == "assistant" and messages[-1].tool_calls:
        raise ChatRequestError("Cannot continue an assistant message that contains tool "
                               "calls.")
    return heuristic


def _thinking_kwargs(body: dict, inputs: ChatInputs, settings: ChatSettings) -> None:
    kwargs = dict(settings.chat_template_kwargs)
    request_kwargs = body.get("chat_template_kwargs")
    kwargs.update(request_kwargs if isinstance(request_kwargs, dict) else {})
    inputs.enable_thinking = settings.enable_thinking
    thinking = kwargs.get("enable_thinking")
    if isinstance(thinking, bool):
        inputs.enable_thinking = thinking
    elif isinstance(thinking, str):
        raise ChatRequestError('invalid type for "enable_thinking" (expected boolean, got '
                               'string)')
    effort = body.get("reasoning_effort")
    if "reasoning_effort" in body and isinstance(effort, str) and effort:
        if effort == "none":
            inputs.enable_thinking = False
            kwargs.pop("reasoning_effort", None)
        else:
            kwargs["reasoning_effort"] = effort
    inputs.chat_template_kwargs = kwargs


def chat_inputs(body: dict, settings: ChatSettings,
                parallel_default: bool = True) -> tuple[ChatInputs, bool]:
    """The template inputs of an OpenAI chat request, and whether a trailing assistant
    message is prefilled by the heuristic. `parallel_default`: the template's
    supports_parallel_tool_calls cap."""
    tools_json = body.get("tools")
    tool_choice = _value(body, "tool_choice", "auto")
    if not settings.use_jinja:
        if isinstance(tools_json, list) and tools_json:
            raise ChatRequestError("tools param requires --jinja flag")
        if tool_choice != "auto":
            raise ChatRequestError("tool_choice param requires --jinja flag")
    if "messages" not in body:
        raise ChatRequestError("'messages' is required")
    _check_messages(body["messages"])
    if tool_choice not in TOOL_CHOICES:
        raise ChatRequestError(f"Invalid tool_choice: {tool_choice}")
    inputs = ChatInputs(messages=messages_from_json(body["messages"]),
                        tools=tools_from_json(tools_json), tool_choice=tool_choice,
                        named_function=named_function(body.get("tool_choice"))
                        if settings.use_jinja else "",
                        grammar=body.get("grammar") or "", use_jinja=settings.use_jinja,
                        parallel_tool_calls=_value(body, "parallel_tool_calls",
                                                   parallel_default),
                        add_generation_prompt=_value(body, "add_generation_prompt", True),
                        reasoning_format=settings.reasoning_format,
                        force_pure_content=settings.force_pure_content)
    if inputs.named_function and not any(t.name == inputs.named_function for t in inputs.tools):
        raise ChatRequestError(f"Invalid tool_choice: function '{inputs.named_function}' is "
                               "not in tools")
    heuristic = _continuation(body, inputs, settings)
    if body.get("reasoning_format") is not None:  # null: the server's, as for any field
        inputs.reasoning_format = reasoning_format_from_name(body["reasoning_format"])
    if inputs.tools and inputs.tool_choice != "none" and "grammar" in body:
        raise ChatRequestError("Cannot use custom grammar constraints with tools.")
    _thinking_kwargs(body, inputs, settings)
    return inputs, heuristic


def named_function(tool_choice: Any) -> str:
    """The function an OpenAI named tool_choice ({"type": "function", "function": {"name":
    ...}}) requires, or "". (llama-server reads a tool_choice that is not a string as
    "auto"; here the named function is a required call of it, as OpenAI's API does.)"""
    if not isinstance(tool_choice, dict):
        return ""
    function = tool_choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if tool_choice.get("type") != "function" or not isinstance(name, str) or not name:
        raise ChatRequestError(f"Invalid tool_choice: {_dump(tool_choice)}")
    return name


def _value(body: dict, key: str, default: Any) -> Any:
    """json_value: the field when it has the default's type, else the default."""
    value = body.get(key, default)
    return value if type(value) is type(default) else default


def reasoning_format_from_name(name: Any) -> str:
    """common_reasoning_format_from_name."""
    if name not in ("none", "auto", "deepseek", "deepseek-legacy"):
        raise ChatRequestError(f"Unknown reasoning format: {name}")
    return name


def chat_prompt(templates: ChatTemplates, body: dict, settings: ChatSettings) -> ChatPrompt:
    """What llama-server's /apply-template and /v1/chat/completions compute from a request:
    the prompt, and the syntax to parse the output with. A trailing assistant message
    continued by the heuristic is not marked as a continuation, so its text is streamed
    with the first generated piece, as llama-server does."""
    caps = (templates.tool_use or templates.default).caps
    inputs, heuristic = chat_inputs(body, settings, caps.supports_parallel_tool_calls)
    result = prepare_chat(templates, inputs)
    if heuristic and result.syntax.is_continuation:
        result = replace(result, syntax=replace(result.syntax, is_continuation=False))
    return result
