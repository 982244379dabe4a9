"""What a chat template says about reasoning, content and turns, found by rendering it:
llama.cpp's differential template analysis (common/chat-diff-analyzer.cpp).

* reasoning markers: an assistant message is rendered with and without a
  `reasoning_content`, and the generation prompt with enable_thinking true and false; the
  markers around the reasoning text (`<think>`/`</think>`, `<|START_THINKING|>`/...) or the
  marker enable_thinking adds or removes give `start` and `end`. When reasoning only
  appears next to tool calls the mode is "tools_only" (Command R7B);
* content markers: content wrapped in markers the template always writes
  (`<|START_RESPONSE|>...<|END_RESPONSE|>`);
* the markers that open a user and an assistant turn.

Known templates the comparisons get wrong are patched afterwards from a table, as in
llama.cpp. The tool-call format (tool_analysis.py) is found in the same pass, and its
markers join the preserved tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import lru_cache

from edgeinfer.chat import peg
from edgeinfer.chat.diff import MARKER, TEXT, prune_whitespace, segmentize, trim
from edgeinfer.chat.probe import (
    ANALYSIS_TOOLS,
    ARG_FIRST,
    ARG_SECOND,
    ASSISTANT,
    ASSISTANT_MSG,
    FUN_FIRST,
    THINKING_CONTENT,
    USER,
    USER_MSG,
    USER_MSG_TWO,
    Comparison,
    Variant,
    compare,
    tool_call,
)
from edgeinfer.chat.render import ChatTemplate
from edgeinfer.chat.tool_analysis import TOOL_TEMPLATE_PATCHES, ToolFormat, analyze_tools

REASONING_NONE, REASONING_TAGS, REASONING_TOOLS_ONLY = "none", "tag_based", "tools_only"
CONTENT_PLAIN, CONTENT_ALWAYS_WRAPPED, CONTENT_WRAPPED_WITH_REASONING = (
    "plain", "always_wrapped", "wrapped_with_reasoning")


@dataclass
class TemplateAnalysis:
    """The markers found (autoparser's reasoning, content and role fields)."""

    reasoning_mode: str = REASONING_NONE
    reasoning_start: str = ""  # e.g. "<think>\n", "<|START_THINKING|>", "" (delimiter style)
    reasoning_end: str = ""  # e.g. "\n</think>\n\n", "<|END_THINKING|>"
    content_mode: str = CONTENT_PLAIN
    content_start: str = ""
    content_end: str = ""
    user_start: str = ""
    assistant_start: str = ""
    preserved_tokens: list[str] = field(default_factory=list)
    additional_stops: list[str] = field(default_factory=list)
    tools: ToolFormat = field(default_factory=ToolFormat)

    @property
    def supports_thinking(self) -> bool:
        return self.reasoning_mode != REASONING_NONE

    @property
    def content_always_wrapped(self) -> bool:
        return self.content_mode == CONTENT_ALWAYS_WRAPPED and bool(self.content_start) \
            and bool(self.content_end)


def _wrapped_parser(text: str, rest: bool = True) -> peg.Parser:
    """pre-marker, the text, post-marker (each marker with its surrounding whitespace)."""
    parser = peg.tag("pre", peg.marker() + peg.space()) + text \
        + peg.tag("post", peg.space() + peg.marker() + peg.space())
    return parser + peg.rest() if rest else parser


# -- reasoning --------------------------------------------------------------------------------
def _reasoning_presence(tmpl: ChatTemplate, found: TemplateAnalysis) -> None:
    """compare_reasoning_presence: markers around a past reasoning_content."""
    with_reasoning = {**ASSISTANT, "reasoning_content": THINKING_CONTENT}
    result = compare(tmpl, Variant([USER, ASSISTANT]),
                     lambda v: replace(v, messages=[USER, with_reasoning]))
    if result is None or THINKING_CONTENT not in result.right:
        return
    parsed, tags = peg.extract_tags(_wrapped_parser(THINKING_CONTENT), result.output_b,
                                    anywhere=True)
    if not parsed.success:
        delimiter = peg.literal(THINKING_CONTENT) + peg.space() \
            + peg.optional(peg.tag("post", peg.marker() + peg.space())) + peg.rest()
        parsed, tags = peg.extract_tags(delimiter, result.output_b, anywhere=True)
    if not parsed.success:
        return
    if tags.get("pre") and tags.get("post"):
        found.reasoning_mode = REASONING_TAGS
        found.reasoning_start, found.reasoning_end = tags["pre"], tags["post"]
    elif tags.get("post"):
        found.reasoning_mode, found.reasoning_end = REASONING_TAGS, tags["post"]


def _thinking_toggle(tmpl: ChatTemplate, found: TemplateAnalysis) -> None:
    """compare_thinking_enabled: what enable_thinking adds to or removes from the
    generation prompt."""
    result = compare(tmpl, Variant([USER], add_generation_prompt=True, enable_thinking=False),
                     lambda v: replace(v, enable_thinking=True))
    if result is None:
        return
    left, right = trim(result.left), trim(result.right)
    if not left and result.right:
        if right and result.output_b.endswith(right) and not found.reasoning_start:
            found.reasoning_start, found.reasoning_mode = result.right, REASONING_TAGS
    elif not right and result.left:
        if left and result.output_a.endswith(left) and not found.reasoning_end:
            segments = prune_whitespace(segmentize(result.output_a))
            if len(segments) >= 2 and segments[-1].value == left and segments[-2].kind == MARKER:
                found.reasoning_start = segments[-2].value
            found.reasoning_end, found.reasoning_mode = result.left, REASONING_TAGS
    elif left and right:
        _thinking_toggle_by_anchor(result, found)
    if found.reasoning_mode == REASONING_NONE and not found.reasoning_start \
            and found.reasoning_end:
        found.reasoning_mode = REASONING_TAGS


def _thinking_toggle_by_anchor(result: Comparison, found: TemplateAnalysis) -> None:
    """When enable_thinking changes more than the tail (SmolLM3 rewrites its system
    message): one output's last 64 characters recur in the other, followed by exactly a
    start and an end marker."""
    for base, extended in ((result.output_b, result.output_a),
                           (result.output_a, result.output_b)):
        anchor = base[len(base) - min(len(base), 64):]
        at = extended.rfind(anchor)
        if at == -1 or at + len(anchor) >= len(extended):
            continue
        extra = trim(extended[at + len(anchor):])
        if not extra:
            continue
        segments = prune_whitespace(segmentize(extra))
        if len(segments) == 2 and all(s.kind == MARKER for s in segments):
            found.reasoning_start = found.reasoning_start or segments[0].value
            found.reasoning_end = found.reasoning_end or segments[1].value
            found.reasoning_mode = REASONING_TAGS
            return


def _reasoning_scope(tmpl: ChatTemplate, found: TemplateAnalysis) -> None:
    """compare_reasoning_scope: reasoning the template only writes beside tool calls."""
    with_content = {**ASSISTANT, "reasoning_content": THINKING_CONTENT}
    with_tools = {"role": "assistant", "content": None, "reasoning_content": THINKING_CONTENT,
                  "tool_calls": [tool_call(FUN_FIRST, {ARG_FIRST: "VVVV", ARG_SECOND: "XXXX"})]}
    result = compare(tmpl, Variant([USER, with_content], tools=ANALYSIS_TOOLS),
                     lambda v: replace(v, messages=[USER, with_tools]))
    if result is None or THINKING_CONTENT in result.output_a \
            or THINKING_CONTENT not in result.output_b:
        return
    found.reasoning_mode = REASONING_TOOLS_ONLY
    wrapped = peg.tag("pre", peg.marker() + peg.space()) + THINKING_CONTENT + peg.space() \
        + peg.tag("post", peg.marker() + peg.space())
    parsed, tags = peg.extract_tags(wrapped, result.output_b, anywhere=True)
    if parsed.success:
        found.reasoning_start, found.reasoning_end = tags.get("pre", ""), tags.get("post", "")
        return
    delimiter = peg.literal(THINKING_CONTENT) + peg.space() \
        + peg.optional(peg.tag("post", peg.marker() + peg.space()))
    parsed, tags = peg.extract_tags(delimiter, result.output_b, anywhere=True)
    if parsed.success:
        found.reasoning_end = tags.get("post", "")
    else:
        found.reasoning_mode = REASONING_NONE


# -- content ----------------------------------------------------------------------------------
def _content(tmpl: ChatTemplate, found: TemplateAnalysis) -> None:
    """analyze_content: markers the template writes around every content."""
    base = Variant([USER, ASSISTANT], tools=ANALYSIS_TOOLS)
    with_tools = {"role": "assistant", "content": "",
                  "tool_calls": [tool_call("test_func", {"arg1": "value1"})]}
    with_reasoning = {"role": "assistant", "content": "", "reasoning_content": THINKING_CONTENT}
    by_tools = compare(tmpl, base, lambda v: replace(v, messages=[USER, with_tools]))
    by_reasoning = compare(tmpl, base, lambda v: replace(v, messages=[USER, with_reasoning]))
    if by_tools is None or by_reasoning is None:
        return
    if not (trim(by_tools.left) == ASSISTANT_MSG and _is_plain(by_reasoning.left, found)):
        rdiff = by_reasoning.left
        if found.reasoning_end and found.reasoning_end in rdiff:
            rdiff = rdiff[rdiff.find(found.reasoning_end) + len(found.reasoning_end):]
        pure = rdiff if len(rdiff) > len(by_tools.left) else by_tools.left
        _, tags = peg.extract_tags(_wrapped_parser(ASSISTANT_MSG), pure, anywhere=True)
        found.content_start, found.content_end = tags.get("pre", ""), tags.get("post", "")
    if found.content_start or found.content_end:
        found.content_mode = CONTENT_ALWAYS_WRAPPED


def _is_plain(reasoning_left: str, found: TemplateAnalysis) -> bool:
    """The content diff holds only the text (and maybe an end-of-turn marker), or only the
    text after the reasoning end marker."""
    only_text = peg.space() + reasoning_left + peg.space() + peg.optional(peg.marker()) \
        + peg.space() + peg.end()
    if peg.extract_tags(only_text, reasoning_left)[0].success:
        return True
    if found.reasoning_mode != REASONING_NONE and found.reasoning_end:
        after = peg.literal(found.reasoning_end) + peg.space() + ASSISTANT_MSG
        return peg.extract_tags(after, reasoning_left, anywhere=True)[0].success
    return False


# -- turn markers -----------------------------------------------------------------------------
def _assistant_start(tmpl: ChatTemplate, found: TemplateAnalysis) -> str:
    """detect_assistant_start_marker: what precedes an assistant message, reasoning
    markers cut off."""
    result = compare(tmpl, Variant([USER]), lambda v: replace(v, messages=[USER, ASSISTANT]))
    if result is None:
        return ""
    head = result.right.split(ASSISTANT_MSG, 1)[0]
    for raw in (found.reasoning_start, found.reasoning_end):
        if raw and trim(raw) in head:
            head = head[: head.find(trim(raw))]
    return trim(head)


def _user_start(tmpl: ChatTemplate) -> str:
    """detect_user_start_marker: the markers that open a user message, leading end-of-turn
    markers skipped."""
    result = compare(tmpl, Variant([]), lambda v: replace(v, messages=[USER]))
    if result is None:
        second = {"role": "user", "content": USER_MSG_TWO}
        result = compare(tmpl, Variant([second, ASSISTANT]),
                         lambda v: replace(v, messages=[second, ASSISTANT, USER]))
        if result is None:
            return ""
    text = result.right
    if ASSISTANT_MSG in text:
        text = text[text.find(ASSISTANT_MSG) + len(ASSISTANT_MSG):]
    candidate, kept, seen_marker = text.split(USER_MSG, 1)[0], "", False
    for segment in segmentize(candidate):
        lower = segment.value.lower()
        if segment.kind == MARKER and not seen_marker and ("end" in lower or "close" in lower):
            continue
        if segment.kind == TEXT and not seen_marker and not trim(segment.value):
            continue
        seen_marker |= segment.kind == MARKER
        kept += segment.value
    return trim(kept)


# -- known templates --------------------------------------------------------------------------
def _old_qwen_thinking(src: str, found: TemplateAnalysis) -> None:
    """Old Qwen/DeepSeek-R1 templates cut `</think>` out of past messages but never render
    reasoning: they still think in <think> tags."""
    if ("content.split('</think>')" in src and "reasoning_content" not in src
            and "<SPECIAL_12>" not in src and found.reasoning_mode == REASONING_NONE):
        found.reasoning_mode = REASONING_TAGS
        found.reasoning_start, found.reasoning_end = "<think>", "</think>"
        found.preserved_tokens += ["<think>", "</think>"]


def _granite_33(src: str, found: TemplateAnalysis) -> None:
    if ("Write your thoughts between <think></think> and write your response between "
            "<response></response>") in src:
        found.reasoning_mode = REASONING_TAGS
        found.reasoning_start, found.reasoning_end = "<think>", "</think>"
        found.content_mode = CONTENT_WRAPPED_WITH_REASONING
        found.content_start, found.content_end = "<response>", "</response>"
        found.preserved_tokens += ["<think>", "</think>", "<response>", "</response>"]


def _command_r_plus(src: str, found: TemplateAnalysis) -> None:
    if "<|CHATBOT_TOKEN|>" in src and "<|END_OF_TURN_TOKEN|>" in src \
            and not found.content_start:
        found.content_mode = CONTENT_ALWAYS_WRAPPED
        found.content_start, found.content_end = "<|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>"
        found.preserved_tokens += ["<|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>"]
        found.user_start = "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>"


def _functionary_31(src: str, found: TemplateAnalysis) -> None:
    if ('set has_code_interpreter = tools | selectattr("type", "equalto", '
            '"code_interpreter") | list | length > 0') in src:
        found.content_mode, found.content_end = CONTENT_PLAIN, ""
        found.preserved_tokens = ["<|eot_id|>", "<|eom_id|>", "<function=", ">", "</function>"]


def _nemotron_nano_v2(src: str, found: TemplateAnalysis) -> None:
    if all(s in src for s in ("<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>", "<TOOL_RESPONSE>")):
        found.content_mode, found.content_start, found.content_end = CONTENT_PLAIN, "", ""
        found.reasoning_mode = REASONING_TAGS
        found.reasoning_start, found.reasoning_end = "<think>\n", "</think>"
        found.assistant_start, found.user_start = "<SPECIAL_11>Assistant", "<SPECIAL_11>User"
        found.preserved_tokens = ["<SPECIAL_11>", "</think>", "<TOOLCALL>", "</TOOLCALL>"]


def _fireworks(src: str, found: TemplateAnalysis) -> None:
    if ("{%- set system_prompt = '<|start_header_id|>' + 'system' + '<|end_header_id|>\\n\\n'"
            " + message['content'] | trim + '\\n' + system_prompt_suffix + '<|eot_id|>' -%}"
            ) in src:
        found.assistant_start = "<|start_header_id|>assistant<|end_header_id|>"
        found.user_start = "<|start_header_id|>user<|end_header_id|>"


def _solar_open(src: str, found: TemplateAnalysis) -> None:
    if "<|begin|>assistant<|think|><|end|>" in src:
        found.assistant_start = "<|begin|>assistant"


def _apriel_16(src: str, found: TemplateAnalysis) -> None:
    if "if not loop.last and '[BEGIN FINAL RESPONSE]' in asst_text" in src:
        found.user_start, found.assistant_start = "<|begin_user|>", "<|begin_assistant|>"


def _laguna(src: str, found: TemplateAnalysis) -> None:
    """Laguna's template writes "<think>\n" but the model emits the bare tags; the
    </assistant> turn end can also come as plain text, so it is a stop string too."""
    if "laguna_glm_thinking" in src:
        found.reasoning_start, found.reasoning_end = trim(found.reasoning_start), \
            trim(found.reasoning_end)
        found.additional_stops.append("</assistant>")


# Applied in order after the comparisons (the `workarounds` list in chat-diff-analyzer.cpp;
# its tool-call-only entries live with the tool-call formats).
KNOWN_TEMPLATE_PATCHES: tuple[Callable[[str, TemplateAnalysis], None], ...] = (
    _old_qwen_thinking, _granite_33, _command_r_plus, _functionary_31, _nemotron_nano_v2,
    _fireworks, _solar_open, _apriel_16, _laguna,
)


def _preserved_tokens(found: TemplateAnalysis) -> list[str]:
    """collect_preserved_tokens: the reasoning, content and tool-call markers, trimmed,
    unique."""
    tokens: list[str] = []
    for marker in (found.reasoning_start, found.reasoning_end, found.content_start,
                   found.content_end, *found.tools.markers()):
        if trim(marker) and trim(marker) not in tokens:
            tokens.append(trim(marker))
    return tokens


@lru_cache(maxsize=16)
def _analyze(source: str, bos_token: str, eos_token: str) -> TemplateAnalysis:
    tmpl = ChatTemplate(source, bos_token, eos_token)
    found = TemplateAnalysis()
    _reasoning_presence(tmpl, found)
    _thinking_toggle(tmpl, found)
    if tmpl.caps.supports_tool_calls:
        _reasoning_scope(tmpl, found)
    _content(tmpl, found)
    if tmpl.caps.supports_tool_calls:
        found.tools = analyze_tools(tmpl, found.reasoning_start, found.reasoning_end)
    found.assistant_start = _assistant_start(tmpl, found)
    found.user_start = _user_start(tmpl)
    found.preserved_tokens = _preserved_tokens(found)
    for patch in KNOWN_TEMPLATE_PATCHES:
        patch(source, found)
    for tool_patch in TOOL_TEMPLATE_PATCHES:
        tool_patch(source, found.tools)
    return found


def analyze_template(tmpl: ChatTemplate) -> TemplateAnalysis:
    """autoparser::analyze_template (cached per template; the result is a copy the caller
    may change)."""
    found = _analyze(tmpl.source, tmpl.bos_token, tmpl.eos_token)
    return replace(found, preserved_tokens=list(found.preserved_tokens),
                   tools=replace(found.tools, parameter_order=list(found.tools.parameter_order)),
                   additional_stops=list(found.additional_stops))
