"""A model's one chat-prompt path: its templates and settings, built once when it loads
(llama.cpp's common_chat_templates_init and server_chat_params), rendering every request.

`run`, the REPL and `Model.apply_chat_template` use it through `Model.chat`, built with the
settings table's defaults; the server builds one from its flags (server/engine.py). All
of them render through `chat_prompt`: the capability-based message shaping, the date
context, the reasoning arguments, tools, and ChatML for a model without a template.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgeinfer.chat.prompt import ChatPrompt, ChatTemplates, init_templates
from edgeinfer.chat.request import ChatSettings, chat_prompt, chat_settings
from edgeinfer.settings import DEFAULTS

# Keyword arguments of apply_chat_template that are request fields; the others are
# chat_template_kwargs (enable_thinking, ...), as an OpenAI client sends them.
REQUEST_FIELDS = ("tools", "tool_choice", "parallel_tool_calls", "continue_final_message",
                  "reasoning_effort", "reasoning_format", "chat_template_kwargs")


@dataclass(frozen=True)
class ModelChat:
    """The templates a model renders with and the settings they render under."""

    templates: ChatTemplates
    settings: ChatSettings

    def caps(self) -> dict[str, bool]:
        return self.templates.default.caps.to_map()

    def prompt(self, body: dict) -> ChatPrompt:
        """The prompt of an OpenAI chat request body (ChatRequestError when it is malformed),
        as /apply-template and /v1/chat/completions render it."""
        return chat_prompt(self.templates, body, self.settings)

    def apply(self, messages: list[dict], add_generation_prompt: bool = True,
              **extra: Any) -> str:
        """The prompt text of `messages`; `extra` as in `chat_body`."""
        return self.prompt(chat_body(messages, add_generation_prompt, **extra)).prompt


def chat_body(messages: list[dict], add_generation_prompt: bool = True, **extra: Any) -> dict:
    """The OpenAI chat request body of apply_chat_template's arguments: REQUEST_FIELDS go
    into the body, every other keyword into its chat_template_kwargs."""
    body: dict[str, Any] = {"messages": messages,
                            "add_generation_prompt": add_generation_prompt}
    kwargs = {k: v for k, v in extra.items() if k not in REQUEST_FIELDS}
    body.update({k: v for k, v in extra.items() if k in REQUEST_FIELDS})
    if kwargs:
        body["chat_template_kwargs"] = {**(body.get("chat_template_kwargs") or {}), **kwargs}
    return body


def special_tokens(tok) -> dict[str, int]:
    """Text -> id of the tokens grammars must name by id (CONTROL and UNKNOWN: llguidance's
    special tokens), so a tool-call grammar can match markers such as [TOOL_CALLS]."""
    return {tok.token_text(i): i for i in tok.special_ids()}


def load_chat(model, template: str = "", *, jinja: bool = DEFAULTS["jinja"],
              reasoning: str = DEFAULTS["reasoning"],
              reasoning_format: str = DEFAULTS["reasoning_format"]) -> ModelChat:
    """`model`'s chat: `template` (a built-in name or Jinja source; "": the GGUF's, ChatML
    when it has none) under llama-server's --jinja, --reasoning and --reasoning-format. A
    template that does not compile raises EdgeInferError."""
    tok = model.tokenizer

    def text(token_id: int | None) -> str:
        return tok.token_text(token_id) if token_id is not None else ""
    templates = init_templates(template, model_template=model.chat_template,
                               model_tool_use_template=model.chat_template_tool_use,
                               bos_token=text(tok.bos_id), eos_token=text(tok.eos_id),
                               add_bos=tok.add_bos, add_eos=tok.add_eos,
                               special_tokens=special_tokens(tok))
    settings = chat_settings(templates, use_jinja=jinja, reasoning=reasoning,
                             reasoning_format=reasoning_format)
    return ModelChat(templates, settings)
