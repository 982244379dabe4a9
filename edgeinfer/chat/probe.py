"""Rendering probes: one template rendered twice with one input changed, and the two
outputs split where they differ (llama.cpp's template_params, apply_template and
compare_variants in common/chat-auto-parser-helpers.cpp).

The inputs are llama.cpp's: recognisable names and values (`FFF_FIRST_FUN_F`,
`AA_ARG_FST_AA`, "XXXX", "call00001", ...) that the analyses then look for in the output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from edgeinfer.chat.diff import diff_split
from edgeinfer.chat.render import ChatTemplate, GenerationParams, direct_apply
from edgeinfer.errors import EdgeInferError

FUN_FIRST, FUN_SECOND = "FFF_FIRST_FUN_F", "SSS_SECOND_FUN_S"
ARG_FIRST, ARG_SECOND = "AA_ARG_FST_AA", "BB_ARG_SND_BB"
USER_MSG, USER_MSG_TWO = "U_USER_MSG Hello END_U", "V_USER_MSG Hello END_V"
ASSISTANT_MSG = "A_ASST_MSG I can help END_A"
THINKING_CONTENT = "REASON_PART I am thinking END_R"

_PARAMS_SCHEMA = {
    "type": "object",
    "properties": {ARG_FIRST: {"type": "string", "description": "First argument"},
                   ARG_SECOND: {"type": "string", "description": "Second argument"}},
    "required": [],
}
ANALYSIS_TOOLS = [
    {"type": "function", "function": {"name": name, "description": description,
                                      "parameters": _PARAMS_SCHEMA}}
    for name, description in ((FUN_FIRST, "Test function foo"), (FUN_SECOND, "Test function bar"))
]
USER = {"role": "user", "content": USER_MSG}
ASSISTANT = {"role": "assistant", "content": ASSISTANT_MSG}


def tool_call(name: str, arguments: dict, call_id: str = "call00001") -> dict:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": arguments}}


@dataclass
class Variant:
    """template_params."""

    messages: list[dict]
    tools: list[dict] | None = None
    add_generation_prompt: bool = False
    enable_thinking: bool = True


@dataclass
class Comparison:
    left: str
    right: str
    prefix: str
    suffix: str
    output_a: str
    output_b: str


def apply(tmpl: ChatTemplate, variant: Variant) -> str | None:
    """apply_template: a failed rendering is None (llama.cpp's ERR_TMPL)."""
    params = GenerationParams(messages=variant.messages, tools=variant.tools,
                              add_generation_prompt=variant.add_generation_prompt,
                              enable_thinking=variant.enable_thinking,
                              extra_context={"enable_thinking": variant.enable_thinking})
    try:
        return direct_apply(tmpl, params)
    except EdgeInferError:
        return None


def compare(tmpl: ChatTemplate, variant_a: Variant,
            modify: Callable[[Variant], Variant]) -> Comparison | None:
    """compare_variants: render A and its modified copy B and split their difference."""
    output_a = apply(tmpl, variant_a)
    output_b = apply(tmpl, modify(replace(variant_a)))
    if output_a is None or output_b is None:
        return None
    split = diff_split(output_a, output_b)
    return Comparison(split.left, split.right, split.prefix, split.suffix, output_a, output_b)
