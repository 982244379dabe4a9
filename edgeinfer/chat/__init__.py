"""Chat: llama.cpp's chat-template and reasoning layer (common/chat.cpp and friends).

One path from messages to a prompt: `load_chat(model, ...)` (model_chat.py) builds a
`ModelChat` once per model, and `run`, the REPL, `Model.apply_chat_template` and every
server route render with it (`chat.prompt(body)`, `chat.apply(messages, ...)`). Inside it,
at startup (common_chat_templates_init, server-context.cpp):

    templates = init_templates(override,        # --chat-template value / file contents, or ""
                               model_template=meta.get("tokenizer.chat_template"),
                               model_tool_use_template=meta.get(
                                   "tokenizer.chat_template.tool_use"),
                               bos_token=..., eos_token=...,   # the vocab's BOS/EOS as text
                               add_bos=..., add_eos=...,       # the tokenizer adds them
                               special_tokens={text: id, ...}) # llguidance's special tokens
    settings = chat_settings(templates, use_jinja=..., reasoning="auto", ...)

Per request (/apply-template, /v1/chat/completions; ChatRequestError means HTTP 400):

    prompt = chat_prompt(templates, body, settings)
    prompt.prompt               # the text to tokenize (/apply-template returns it)
    prompt.additional_stops     # stop strings to add to the request's
    prompt.preserved_tokens     # special tokens to detokenize as text (tool-call markers)
    prompt.grammar              # tool calls: llguidance Lark, "" for none; with
    prompt.grammar_lazy         #   grammar_lazy it starts at the first grammar_triggers word
    prompt.grammar_triggers     #   (fed from that word on), else at the first token (fed
                                #   prompt.generation_prompt first)
    parser = ChatParser(prompt.syntax, echo=False)
    for piece in generated_text:            # decoded text, whole characters
        diffs = parser.feed(piece)          # list[MsgDiff]: reasoning/content/tool-call deltas
    diffs = parser.finish()                 # last diffs; ChatParseError if the output
    message = parser.message                # does not fit the template's format

Lower level: `prepare_chat(templates, ChatInputs(...))` renders typed inputs;
`messages_from_json` / `tools_from_json` read OpenAI JSON; `legacy` holds the --no-jinja
formats; `render_chat` renders a template alone (no message shaping, no date context).
"""

from __future__ import annotations

import importlib

# Each public name and its module, imported on first use: `edgeinfer --help` imports none.
_MODULES = {
    "grammar": ("GrammarTrigger",),
    "model_chat": ("ModelChat", "load_chat"),
    "message": ("ChatMsg", "ContentPart", "MsgDiff", "ToolCall", "msg_diffs"),
    "parser": ("ChatParseError", "ChatParser", "ChatSyntax", "gen_tool_call_id"),
    "prompt": ("ChatInputs", "ChatPrompt", "ChatTemplates", "ChatTool", "init_templates",
               "prepare_chat", "supports_enable_thinking", "verify_template"),
    "request": ("ChatRequestError", "ChatSettings", "chat_inputs", "chat_prompt",
                "chat_settings", "messages_from_json", "tools_from_json"),
    "template": ("CHATML_TEMPLATE", "compile_template", "render_chat"),
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'edgeinfer.chat' has no attribute '{name}'")
    value = getattr(importlib.import_module(f"edgeinfer.chat.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
