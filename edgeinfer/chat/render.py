"""Rendering a Jinja chat template the way llama.cpp's common/chat.cpp does.

`direct_apply` is common_chat_template_direct_apply: the variables a template sees are
`messages` (shaped for the template's caps), `bos_token`, `eos_token`, `enable_thinking`
(always), `tools` (only when there are some), the extra context (today's date as
`datetime` and `date_string`, then the chat_template_kwargs), and `add_generation_prompt`
(only when true: some templates test `is defined`). A `preserve_reasoning` or
`reasoning_effort` kwarg is also given under the other names templates use for it.

`generation_prompt` is what add_generation_prompt appends: the tail where the rendering
with it differs from the rendering without it. It is the text the model continues from,
which the output parser re-reads before the generated text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

from edgeinfer.chat.caps import (
    TemplateCaps,
    detect_caps,
    preserve_reasoning_context,
    reasoning_effort_context,
)
from edgeinfer.chat.message import ChatMsg
from edgeinfer.chat.template import render_template


@dataclass(eq=False)
class ChatTemplate:
    """A Jinja chat template with the BOS/EOS strings it is rendered with
    (common_chat_template)."""

    source: str
    bos_token: str = ""
    eos_token: str = ""

    @cached_property
    def caps(self) -> TemplateCaps:
        return detect_caps(self.source)


# Continuation of the last message (common_chat_continuation).
CONTINUE_NONE, CONTINUE_AUTO, CONTINUE_REASONING, CONTINUE_CONTENT = (
    "none", "auto", "reasoning", "content")


@dataclass
class GenerationParams:
    """autoparser::generation_params: the inputs of one rendering, messages already as
    JSON. `continue_msg` is the message being continued, left out of `messages`."""

    messages: list[dict] = field(default_factory=list)
    tools: list[dict] | None = None
    tool_choice: str = "auto"
    json_schema: dict | None = None
    parallel_tool_calls: bool = True
    reasoning_format: str = "auto"
    add_generation_prompt: bool = False
    continue_final_message: str = CONTINUE_NONE
    continue_msg: ChatMsg | None = None
    enable_thinking: bool = True
    extra_context: dict[str, Any] = field(default_factory=dict)
    add_bos: bool = False
    add_eos: bool = False

    @property
    def has_continuation(self) -> bool:
        return self.continue_final_message != CONTINUE_NONE and self.continue_msg is not None \
            and not self.continue_msg.empty()


def concat_content_parts(parts: list[dict]) -> str:
    """Typed text parts joined with newlines, none around media markers
    (messages_inp_normalizer::concat_content_parts)."""
    text, last_was_media = "", False
    for part in parts:
        kind = part.get("type", "")
        if kind == "text":
            newline = not last_was_media and bool(text)
            last_was_media = False
        elif kind == "media_marker":
            newline, last_was_media = False, True
        else:
            continue
        text += ("\n" if newline else "") + part.get("text", "")
    return text


def normalize_messages(messages: list[dict], caps: TemplateCaps) -> list[dict]:
    """Give each message's content the shape the template reads: a string for templates
    that only read strings, a list of text parts for templates that only read parts."""
    only_string = caps.supports_string_content and not caps.supports_typed_content
    only_typed = caps.supports_typed_content and not caps.supports_string_content
    if not (only_string or only_typed):
        return messages
    shaped = []
    for message in messages:
        content = message.get("content")
        if only_typed and isinstance(content, str):
            message = {**message, "content": [{"type": "text", "text": content}]}
        elif only_string and isinstance(content, list):
            message = {**message, "content": concat_content_parts(content)}
        shaped.append(message)
    return shaped


def extra_context(now: datetime | None = None) -> dict[str, str]:
    """common_chat_extra_context: today's date in the two forms Llama 3.x (`date_string`)
    and firefunction (`datetime`) templates read, in local time."""
    now = now or datetime.now()
    return {"datetime": now.strftime("%b %d %Y"), "date_string": now.strftime("%d %b %Y")}


def direct_apply(tmpl: ChatTemplate, params: GenerationParams, *,
                 messages_override: list[dict] | None = None,
                 tools_override: list[dict] | None = None,
                 additional_context: dict | None = None) -> str:
    """common_chat_template_direct_apply_impl."""
    messages = messages_override if messages_override is not None else \
        normalize_messages(params.messages, tmpl.caps)
    inputs: dict[str, Any] = {"messages": messages, "bos_token": tmpl.bos_token,
                              "eos_token": tmpl.eos_token,
                              "enable_thinking": params.enable_thinking}
    if tools_override is not None or params.tools:
        inputs["tools"] = tools_override if tools_override is not None else params.tools
    inputs.update(params.extra_context or {})
    inputs.update(additional_context or {})
    if params.add_generation_prompt:
        inputs["add_generation_prompt"] = True
    context: dict[str, Any] = {}
    if isinstance(inputs.get("preserve_reasoning"), bool):
        context.update(preserve_reasoning_context(inputs["preserve_reasoning"]))
    if isinstance(inputs.get("reasoning_effort"), str):
        context.update(reasoning_effort_context(inputs["reasoning_effort"]))
    context.update(inputs)  # what the request set itself wins over the derived names
    result = render_template(tmpl.source, context)
    if params.add_bos and result.startswith(tmpl.bos_token):
        result = result[len(tmpl.bos_token):]
    if params.add_eos and tmpl.eos_token and result.endswith(tmpl.eos_token):
        result = result[: len(result) - len(tmpl.eos_token)]
    return result


def generation_prompt(tmpl: ChatTemplate, params: GenerationParams, **overrides) -> str:
    """common_chat_template_generation_prompt: the rendering with add_generation_prompt
    minus its longest common prefix with the rendering without it."""
    base = {**vars(params), "continue_final_message": CONTINUE_NONE}
    without = direct_apply(tmpl, GenerationParams(**{**base, "add_generation_prompt": False}),
                           **overrides)
    with_it = direct_apply(tmpl, GenerationParams(**{**base, "add_generation_prompt": True}),
                           **overrides)
    common = 0
    for a, b in zip(without, with_it):
        if a != b:
            break
        common += 1
    return with_it[common:]
