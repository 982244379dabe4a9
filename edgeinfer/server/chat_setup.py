"""The server's chat templates, built once when the model first loads (llama-server's
common_chat_templates_init and server_chat_params): --chat-template(-file) or the GGUF's
templates, --jinja, --reasoning and --reasoning-format. The chat layer's `ModelChat` (the
one prompt path `run` and the Python API use too) built from the server's flags. A template
that does not compile is a load failure, as in llama-server."""

from __future__ import annotations

from edgeinfer.chat.model_chat import ModelChat, special_tokens
from edgeinfer.chat.model_chat import load_chat as model_chat
from edgeinfer.server.options import ChatOptions

ServerChat = ModelChat
__all__ = ["ServerChat", "load_chat", "special_tokens"]


def load_chat(model, options: ChatOptions) -> ServerChat:
    return model_chat(model, options.template, jinja=options.jinja,
                      reasoning=options.reasoning, reasoning_format=options.reasoning_format)
