"""Chat: llama.cpp's chat template and reasoning layer (common/chat.cpp and friends).

Startup (once per model):

    templates = init_templates(override, model_template=..., model_tool_use_template=...,
                               bos_token=..., eos_token=..., add_bos=..., add_eos=...)
    settings = chat_settings(templates, use_jinja=..., reasoning="auto", ...)

Per request (/apply-template, /v1/chat/completions):

    prompt = chat_prompt(templates, body, settings)   # ChatRequestError -> HTTP 400
    prompt.prompt                                     # the text to tokenize
    parser = ChatParser(prompt.syntax)
    for piece in generated_text_pieces:
        diffs = parser.feed(piece)                    # list[MsgDiff] for the stream
    diffs = parser.finish()                           # ChatParseError if it does not fit
    parser.message                                    # the final ChatMsg

Lower level: `prepare_chat(templates, ChatInputs(...))` renders from typed inputs;
`messages_from_json` / `tools_from_json` read OpenAI JSON; `legacy` holds the --no-jinja
formatters; `render_chat` renders a template directly (used by edgeinfer.api).
"""

from edgeinfer.chat.message import ChatMsg, ContentPart, MsgDiff, ToolCall, msg_diffs
from edgeinfer.chat.parser import ChatParseError, ChatParser, ChatSyntax
from edgeinfer.chat.prompt import (
    ChatInputs,
    ChatPrompt,
    ChatTemplates,
    ChatTool,
    init_templates,
    prepare_chat,
    supports_enable_thinking,
    verify_template,
)
from edgeinfer.chat.request import (
    ChatRequestError,
    ChatSettings,
    chat_inputs,
    chat_prompt,
    chat_settings,
    messages_from_json,
    tools_from_json,
)
from edgeinfer.chat.template import CHATML_TEMPLATE, compile_template, render_chat

__all__ = [
    "CHATML_TEMPLATE", "ChatInputs", "ChatMsg", "ChatParseError", "ChatParser", "ChatPrompt",
    "ChatRequestError", "ChatSettings", "ChatSyntax", "ChatTemplates", "ChatTool",
    "ContentPart", "MsgDiff", "ToolCall", "chat_inputs", "chat_prompt", "chat_settings",
    "compile_template", "init_templates", "messages_from_json", "msg_diffs", "prepare_chat",
    "render_chat", "supports_enable_thinking", "tools_from_json", "verify_template",
]
