"""Templates llama.cpp does not analyse but hands to a dedicated handler
(common_chat_try_specialized_template in common/chat.cpp, handlers in common/parsers/).

Each row names the handler and the substrings of the template source that select it: all of
`present`, none of `absent`. Rows are tried in llama.cpp's order. The handlers mostly exist
for tool-call formats; until one is registered in HANDLERS, a template that matches a row
is rendered and parsed by the generic path (template analysis), which the ChatPrompt
reports in its `specialized` field.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Specialized:
    name: str
    present: tuple[str, ...]
    absent: tuple[str, ...] = ()

    def matches(self, src: str) -> bool:
        return all(s in src for s in self.present) and not any(s in src for s in self.absent)


SPECIALIZED_TEMPLATES: tuple[Specialized, ...] = (
    Specialized("ministral-3", ("[SYSTEM_PROMPT]", "[TOOL_CALLS]", "[ARGS]"), ("[CALL_ID]",)),
    Specialized("gpt-oss", ("<|channel|>",)),
    Specialized("muse-glimmer", ("<atem:function_calls>", "<|eom|>")),
    Specialized("functionary-v3.2", (">>>all", ">>>${recipient}")),
    Specialized("kimi-k2", ("<|tool_calls_section_begin|>", "<|tool_call_begin|>")),
    Specialized("kimi-k3", ("<|open|>", "<|close|>", "<|end_of_msg|>")),
    Specialized("ling-3", ("<role>ASSISTANT</role>", "<arg_key>")),
    Specialized("cohere2moe", ("<|START_TEXT|>", "<|START_ACTION|>")),
    Specialized("lfm2", ("<|tool_list_start|>", "<|tool_list_end|>")),
    Specialized("lfm2.5", ("List of tools: [",), ("<|tool_list_start|>",)),
    Specialized("gigachat-v3", ("<|role_sep|>", "<|message_sep|>"), ("<|function_call|>",)),
    Specialized("minimax-m3", ("]<]minimax[>[", "<tool_call>", "<invoke name=")),
    Specialized("deepseek-v3.2", ("dsml_token", "DSML", "tool_calls")),
    Specialized("deepseek-v3.2", ("dsml_token", "DSML", "function_calls")),
    Specialized("gemma4", ("'<|tool_call>call:'",)),
    Specialized("minicpm5", ("Tool usage guidelines:", '<function name="', '<param name="')),
    Specialized("qwen3-coder", ("<tool_call>", "<function=", "<parameter="),
                ("'<tool_call><function=' ~ tool_call.name ~ '>'",)),
)

# name -> handler(template, generation params) -> ChatPrompt; filled by later modules.
HANDLERS: dict[str, Callable] = {}


def detect_specialized(src: str) -> str | None:
    """The handler llama.cpp would pick for this template source, if any."""
    for row in SPECIALIZED_TEMPLATES:
        if row.matches(src):
            return row.name
    return None
