"""The server's chat templates, built once when the model first loads (llama-server's
common_chat_templates_init and server_chat_params): --chat-template(-file) or the GGUF's
templates, --jinja, --reasoning and --reasoning-format. A template that does not compile is
a load failure, as in llama-server."""

from __future__ import annotations

from dataclasses import dataclass

from edgeinfer.chat import ChatSettings, ChatTemplates, chat_settings, init_templates
from edgeinfer.server.options import ChatOptions


@dataclass(frozen=True)
class ServerChat:
    templates: ChatTemplates
    settings: ChatSettings

    def caps(self) -> dict[str, bool]:
        return self.templates.default.caps.to_map()


def special_tokens(tok) -> dict[str, int]:
    """Text -> id of the tokens grammars must name by id (CONTROL and UNKNOWN: llguidance's
    special tokens), so a tool-call grammar can match markers such as [TOOL_CALLS]."""
    return {tok.token_text(i): i for i in tok.special_ids()}


def load_chat(model, options: ChatOptions) -> ServerChat:
    tok = model.tokenizer

    def text(token_id: int | None) -> str:
        return tok.token_text(token_id) if token_id is not None else ""
    templates = init_templates(options.template, model_template=model.chat_template,
                               model_tool_use_template=model.chat_template_tool_use,
                               bos_token=text(tok.bos_id), eos_token=text(tok.eos_id),
                               add_bos=tok.add_bos, add_eos=tok.add_eos,
                               special_tokens=special_tokens(tok))
    settings = chat_settings(templates, use_jinja=options.jinja, reasoning=options.reasoning,
                             reasoning_format=options.reasoning_format)
    return ServerChat(templates, settings)
