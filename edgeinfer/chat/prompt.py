"""Chat template selection and prompt building: llama.cpp's common_chat_templates_init and
common_chat_templates_apply (common/chat.cpp).

Selection: an explicit template (--chat-template's value or --chat-template-file's contents)
wins over the GGUF's `tokenizer.chat_template`; a GGUF `tokenizer.chat_template.tool_use`
template is used for requests with tools; none, or the name "chatml", gives ChatML. Under
--no-jinja the selected source is not rendered but recognised (legacy.py): a built-in name
("llama3", "command-r", ...) or a known template's tell-tale substrings.

Building (Jinja): messages become the JSON the template reads and are shaped for its caps
(a system message it ignores is merged into the next one, tool-call arguments parsed when it
reads their fields, "developer" becomes "system"); a continued final message is left out of
the rendering and appended after the generation prompt; the template's reasoning markers
and tool-call format (analysis.py, tool_analysis.py) and the generation prompt make the
ChatSyntax the output parser needs. With tools, the same parser gives the grammar that
constrains the calls (grammar.py), lazy under tool_choice "auto" (from the call marker
on), from the first token under "required" (peg_generator::generate_parser).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from edgeinfer.chat import legacy
from edgeinfer.chat.analysis import REASONING_NONE, TemplateAnalysis, analyze_template
from edgeinfer.chat.diff import trim
from edgeinfer.chat.grammar import GrammarTrigger, lark_grammar
from edgeinfer.chat.message import ChatMsg
from edgeinfer.chat.parser import (
    FORMAT_CONTENT_ONLY,
    FORMAT_PEG,
    FORMAT_PURE_CONTENT,
    ChatSyntax,
    build_parser,
    tool_body_parser,
)
from edgeinfer.chat.render import (
    CONTINUE_AUTO,
    CONTINUE_CONTENT,
    CONTINUE_NONE,
    CONTINUE_REASONING,
    ChatTemplate,
    GenerationParams,
    direct_apply,
    extra_context,
    generation_prompt,
    normalize_messages,
)
from edgeinfer.chat.specialized import detect_specialized
from edgeinfer.chat.template import CHATML_TEMPLATE, compile_template
from edgeinfer.errors import EdgeInferError

# Source patches llama.cpp applies before compiling (common_chat_templates_init): checks in
# two templates that reject messages llama.cpp itself produces.
_SOURCE_PATCHES = (
    (("<|channel|>", "in message.content or"),
     "{%- if \"<|channel|>analysis<|message|>\" in message.content or "
     "\"<|channel|>final<|message|>\" in message.content %}", "{%- if false %}"),
    (("[TOOL_CALLS]", "if (message['content'] is none or"),
     "{%- if (message['content'] is none or message['content'] == '' or "
     "message['content']|length == 0) and (message['tool_calls'] is not defined or "
     "message['tool_calls'] is none or message['tool_calls']|length == 0) %}",
     "{%- if false %}"),
)


@dataclass(frozen=True)
class ChatTool:
    """common_chat_tool: a function the model may call."""

    name: str
    description: str = ""
    parameters: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"type": "function", "function": {"name": self.name,
                                                 "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass
class ChatTemplates:
    """common_chat_templates: the default template, the tool-use one if the model has it,
    and whether the tokenizer adds BOS/EOS itself (then a template's own is cut off).
    `special_tokens` (text -> id) are the vocabulary's tokens that grammars must name by id
    (llguidance matches special tokens by id, never as text)."""

    default: ChatTemplate
    tool_use: ChatTemplate | None = None
    add_bos: bool = False
    add_eos: bool = False
    explicit: bool = False  # a template was given or found in the model
    special_tokens: dict[str, int] = field(default_factory=dict)

    def source(self, variant: str = "") -> str:
        if variant == "tool_use":
            return self.tool_use.source if self.tool_use else ""
        return self.default.source


def init_templates(override: str = "", *, model_template: str | None = None,
                   model_tool_use_template: str | None = None, bos_token: str = "",
                   eos_token: str = "", add_bos: bool = False, add_eos: bool = False,
                   special_tokens: dict[str, int] | None = None) -> ChatTemplates:
    """common_chat_templates_init. `override`: --chat-template's value or the contents of
    --chat-template-file; `model_*`: the GGUF's tokenizer.chat_template(.tool_use);
    `bos_token`/`eos_token`: the vocabulary's BOS/EOS as text ("" when it has none);
    `special_tokens`: the text and id of each token llguidance treats as special (those
    its tokenizer marks special), for the tool-call grammars."""
    default_src = override or (model_template or "")
    tool_use_src = "" if override else (model_tool_use_template or "")
    explicit = bool(override or model_template or model_tool_use_template)
    if not default_src or default_src == "chatml":
        default_src = tool_use_src or CHATML_TEMPLATE
    for needles, old, new in _SOURCE_PATCHES:
        if all(n in default_src for n in needles):
            default_src = default_src.replace(old, new)
    compile_template(default_src)  # a template that does not parse fails now, as in llama.cpp
    tool_use = None
    if tool_use_src:
        try:
            compile_template(tool_use_src)
            tool_use = ChatTemplate(tool_use_src, bos_token, eos_token)
        except EdgeInferError:
            tool_use = None  # llama.cpp ignores a tool-use template that does not parse
    return ChatTemplates(ChatTemplate(default_src, bos_token, eos_token), tool_use,
                         add_bos, add_eos, explicit, dict(special_tokens or {}))


@dataclass
class ChatInputs:
    """common_chat_templates_inputs. `chat_template_kwargs` values are decoded JSON.
    `tool_choice` is "auto", "none" or "required"; `named_function` (with "required") limits
    the calls to one of the tools, which are all rendered (OpenAI's named tool_choice)."""

    messages: list[ChatMsg] = field(default_factory=list)
    tools: list[ChatTool] = field(default_factory=list)
    tool_choice: str = "auto"
    named_function: str = ""
    json_schema: dict | None = None
    grammar: str = ""
    add_generation_prompt: bool = True
    continue_final_message: str = CONTINUE_NONE
    use_jinja: bool = True
    parallel_tool_calls: bool = False
    reasoning_format: str = "none"
    enable_thinking: bool = True
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    force_pure_content: bool = False
    now: datetime | None = None


@dataclass(frozen=True)
class ChatPrompt:
    """common_chat_params: the prompt and what reading the output needs.

    `syntax` goes to ChatParser. `generation_prompt` is the tail of `prompt` the model
    continues from. `thinking_start_tag`/`thinking_end_tags` are the trimmed reasoning
    markers (for a reasoning budget), `message_delimiters` the (role, marker) pairs that
    open turns, `specialized` the llama.cpp handler this template would get (reasoning and
    content are read generically here, tool calls not at all).

    Tool calls: `grammar` is an llguidance Lark grammar ("" for none). Lazy
    (`grammar_lazy`, tool_choice "auto"): unconstrained until one of `grammar_triggers`
    (words) appears in the generated text outside reasoning; the grammar is then fed the
    text from the trigger's first character. Not lazy ("required", a named function): it
    applies from the first token, after being fed `generation_prompt` (its root starts
    with the prompt's tail). `preserved_tokens` are special tokens the detokenizer must
    write as text for the parser to see them."""

    prompt: str
    syntax: ChatSyntax = field(default_factory=ChatSyntax)
    generation_prompt: str = ""
    grammar: str = ""
    grammar_lazy: bool = False
    grammar_triggers: tuple[GrammarTrigger, ...] = ()
    supports_thinking: bool = False
    thinking_start_tag: str = ""
    thinking_end_tags: tuple[str, ...] = ()
    preserved_tokens: tuple[str, ...] = ()
    additional_stops: tuple[str, ...] = ()
    message_delimiters: tuple[tuple[str, str], ...] = ()
    specialized: str | None = None

    @property
    def grammar_prefill(self) -> str:
        """The text a non-lazy grammar is fed before the generated text (llama.cpp's
        prefill of the generation prompt's tokens); "" when there is none to feed."""
        return self.generation_prompt if self.grammar and not self.grammar_lazy else ""


def prepare_chat(templates: ChatTemplates, inputs: ChatInputs) -> ChatPrompt:
    """common_chat_templates_apply: the Jinja path, or the built-in formatters under
    --no-jinja. Errors (a template's raise_exception, bad tool-call arguments, an
    unsupported legacy template) raise EdgeInferError."""
    if inputs.use_jinja:
        return _apply_jinja(templates, inputs)
    return _apply_legacy(templates, inputs)


def supports_enable_thinking(templates: ChatTemplates) -> bool:
    """common_chat_templates_support_enable_thinking: does the template have reasoning
    markers (rendering one user message with thinking on)?"""
    inputs = ChatInputs(messages=[ChatMsg(role="user", content="test")],
                        reasoning_format="deepseek", enable_thinking=True)
    return prepare_chat(templates, inputs).supports_thinking


def verify_template(source: str, use_jinja: bool) -> bool:
    """common_chat_verify_template: can --chat-template's value be used at all?"""
    if not use_jinja:
        return legacy.detect_template(source) is not None
    try:
        templates = init_templates(source)
        prepare_chat(templates, ChatInputs(messages=[ChatMsg(role="user", content="test")]))
        return True
    except EdgeInferError:
        return False


# -- Jinja ------------------------------------------------------------------------------------
def _apply_jinja(templates: ChatTemplates, inputs: ChatInputs) -> ChatPrompt:
    tools = [tool.to_json() for tool in inputs.tools] or None
    tmpl = templates.tool_use if tools and templates.tool_use else templates.default
    messages = inputs.messages
    if "You have access to the following functions in JSONSchema format" in tmpl.source:
        messages = [_trimmed(m) for m in messages]  # StepFun: stray whitespace makes it loop
    params = GenerationParams(
        messages=normalize_messages([m.to_json() for m in messages], tmpl.caps),
        tools=tools, tool_choice=_tool_choice(inputs), json_schema=inputs.json_schema,
        parallel_tool_calls=inputs.parallel_tool_calls,
        reasoning_format=inputs.reasoning_format, enable_thinking=inputs.enable_thinking,
        add_generation_prompt=inputs.add_generation_prompt, add_bos=templates.add_bos,
        add_eos=templates.add_eos)
    _set_continuation(params, inputs)
    _shape_for_template(params, tmpl)
    params.extra_context = {**extra_context(inputs.now), **inputs.chat_template_kwargs}
    if tools and inputs.tool_choice != "none" and inputs.grammar:
        raise EdgeInferError("Cannot specify grammar with tools")
    if inputs.force_pure_content:
        return _pure_content(tmpl, params)
    prompt = _generic(tmpl, params, detect_specialized(tmpl.source), inputs.named_function)
    return _with_tool_grammar(prompt, templates.special_tokens)


def _tool_choice(inputs: ChatInputs) -> str:
    """A named function is a required call of that function."""
    if not inputs.named_function:
        return inputs.tool_choice
    if all(tool.name != inputs.named_function for tool in inputs.tools):
        raise EdgeInferError(f"tool_choice names a function that is not in tools: "
                             f"{inputs.named_function}")
    return "required"


def _trimmed(msg: ChatMsg) -> ChatMsg:
    parts = tuple(replace(p, text=trim(p.text)) if p.type == "text" else p
                  for p in msg.content_parts)
    return replace(msg, content=trim(msg.content), reasoning_content=trim(msg.reasoning_content),
                   content_parts=parts)


def _set_continuation(params: GenerationParams, inputs: ChatInputs) -> None:
    """The continued message is not rendered; "auto" continues its reasoning when it has
    only reasoning, its content otherwise."""
    mode = inputs.continue_final_message
    params.continue_final_message = mode
    if mode == CONTINUE_NONE:
        return
    params.add_generation_prompt = False
    if not inputs.messages:
        return
    params.continue_msg = last = inputs.messages[-1]
    params.messages = params.messages[:-1]
    if mode == CONTINUE_AUTO:
        only_reasoning = last.reasoning_content and not last.content and not last.content_parts
        params.continue_final_message = CONTINUE_REASONING if only_reasoning \
            else CONTINUE_CONTENT


def _shape_for_template(params: GenerationParams, tmpl: ChatTemplate) -> None:
    """The message workarounds of common_chat_templates_apply_jinja."""
    messages = [dict(m) for m in params.messages]
    if "<|channel|>" not in tmpl.source:  # GPT-OSS alone keeps the developer role
        for m in messages:
            if m.get("role") == "developer":
                m["role"] = "system"
    if not tmpl.caps.supports_system_role and messages and messages[0].get("role") == "system":
        first = messages.pop(0)
        if messages:
            messages[0]["content"] = _text(first) + "\n" + _text(messages[0])
    if tmpl.caps.supports_tool_calls:
        for m in messages:
            if "tool_calls" in m and "content" not in m:
                m["content"] = ""
    if tmpl.caps.supports_object_arguments:
        messages = [_arguments_as_objects(m) for m in messages]
    params.messages = messages


def _text(message: dict) -> str:
    content = message.get("content")
    if not isinstance(content, str):
        raise EdgeInferError("the template takes no system message, and merging it into the "
                             "next one needs text content")
    return content


def _arguments_as_objects(message: dict) -> dict:
    if "tool_calls" not in message:
        return message
    calls = []
    for call in message["tool_calls"]:
        function = dict(call.get("function", {}))
        if isinstance(function.get("arguments"), str):
            try:
                function["arguments"] = json.loads(function["arguments"])
            except ValueError as exc:
                raise EdgeInferError("Failed to parse tool call arguments as JSON: "
                                     f"{exc}") from exc
        calls.append({**call, "function": function})
    return {**message, "tool_calls": calls}


def _pure_content(tmpl: ChatTemplate, params: GenerationParams) -> ChatPrompt:
    """--skip-chat-parsing: everything after the generation prompt is content."""
    prompt = direct_apply(tmpl, replace(params, reasoning_format="none"))
    gen = generation_prompt(tmpl, params)
    syntax = ChatSyntax(format=FORMAT_PURE_CONTENT, generation_prompt=gen)
    return ChatPrompt(prompt, syntax, gen)


def _generic(tmpl: ChatTemplate, params: GenerationParams, specialized: str | None,
             named_function: str = "") -> ChatPrompt:
    """peg_generator::generate_parser with the template analysis. A template llama.cpp
    gives a dedicated handler (`specialized`) gets no tool format: the generic one its
    analysis finds is often wrong (Gemma 4, Kimi, MiniMax M3, ...), so its output is read
    as reasoning and content, with no grammar and no tool markers preserved."""
    found = analyze_template(tmpl)
    if specialized:
        found = _without_tool_markers(found)
    prompt = direct_apply(tmpl, params)
    gen = parser_gen = generation_prompt(tmpl, params)
    if params.has_continuation:
        gen = _continued_generation_prompt(gen, params, found)
        prompt += gen
    start = trim(found.reasoning_start)
    prefix = parser_gen[: parser_gen.find(start)] if start and start in parser_gen \
        else parser_gen
    syntax = ChatSyntax(
        format=FORMAT_PEG, generation_prompt=gen, prefix=prefix,
        reasoning_format=params.reasoning_format, reasoning_mode=found.reasoning_mode,
        reasoning_start=found.reasoning_start, reasoning_end=found.reasoning_end,
        content_start=found.content_start if found.content_always_wrapped else "",
        content_end=found.content_end if found.content_always_wrapped else "",
        is_continuation=params.continue_final_message != CONTINUE_NONE,
        tool_format=found.tools if found.tools.mode and not specialized else None,
        tools=_parsed_tools(params, tmpl, named_function), tool_choice=params.tool_choice,
        parallel_tool_calls=params.parallel_tool_calls)
    return ChatPrompt(prompt, syntax, gen, **_thinking_fields(found), specialized=specialized)


def _without_tool_markers(found: TemplateAnalysis) -> TemplateAnalysis:
    kept = {trim(m) for m in (found.reasoning_start, found.reasoning_end, found.content_start,
                              found.content_end)}
    tool_only = {trim(m) for m in found.tools.markers()} - kept
    return replace(found, preserved_tokens=[t for t in found.preserved_tokens
                                            if t not in tool_only])


def _parsed_tools(params: GenerationParams, tmpl: ChatTemplate,
                  named_function: str) -> tuple[dict, ...]:
    """The tools the output parser reads calls of: none under tool_choice "none" or for a
    template that renders no tool calls; only the named function under a named choice."""
    if not params.tools or params.tool_choice == "none" or not tmpl.caps.supports_tool_calls:
        return ()
    return tuple(tool for tool in params.tools
                 if not named_function or tool["function"]["name"] == named_function)


def _with_tool_grammar(prompt: ChatPrompt, special_tokens: dict[str, int]) -> ChatPrompt:
    """The grammar of the calls (generate_parser's include_grammar): lazy from the format's
    call marker under "auto" (no marker, no grammar: Llama 3.x's bare JSON), whole under
    "required". The OpenAI wrapper some models write is a second trigger."""
    syntax = prompt.syntax
    if tool_body_parser(syntax) is None:
        return prompt
    fmt, lazy = syntax.tool_format, syntax.tool_choice == "auto"
    if lazy and not fmt.trigger:
        return prompt
    grammar = lark_grammar(build_parser(syntax), lazy=lazy, special_tokens=special_tokens)
    triggers = ()
    if lazy:
        triggers = (GrammarTrigger("word", fmt.trigger),)
        if fmt.openai_wrapper_trigger:
            triggers += (GrammarTrigger("word", '{"type": "function",'),)
    return replace(prompt, grammar=grammar, grammar_lazy=lazy, grammar_triggers=triggers)


def _continued_generation_prompt(gen: str, params: GenerationParams,
                                 found: TemplateAnalysis) -> str:
    """The generation prompt, then the continued message written as the model would have:
    its reasoning after the start marker, and for a content continuation the end marker
    and the content (parts joined by a blank line)."""
    msg = params.continue_msg
    content = params.continue_final_message == CONTINUE_CONTENT
    if found.reasoning_start:
        at = gen.find(found.reasoning_start)
        gen = (gen[:at] if at != -1 else gen) + found.reasoning_start + msg.reasoning_content
        if content:
            gen += found.reasoning_end
    if content:
        gen += msg.render_content()
    return gen


def _thinking_fields(found: TemplateAnalysis) -> dict:
    delimiters = tuple((role, marker) for role, marker in
                       (("assistant", found.assistant_start), ("user", found.user_start))
                       if marker)
    fields = {"preserved_tokens": tuple(found.preserved_tokens),
              "additional_stops": tuple(found.additional_stops),
              "message_delimiters": delimiters,
              "supports_thinking": found.reasoning_mode != REASONING_NONE}
    if fields["supports_thinking"]:
        fields["thinking_start_tag"] = trim(found.reasoning_start)
        end = trim(found.reasoning_end)
        fields["thinking_end_tags"] = (end,) if end else ()
    return fields


# -- --no-jinja -------------------------------------------------------------------------------
def _apply_legacy(templates: ChatTemplates, inputs: ChatInputs) -> ChatPrompt:
    """common_chat_templates_apply_legacy: role and text of each message through the
    built-in formatter the template source names or resembles; no output grammar."""
    chat = [(m.role, _legacy_text(m)) for m in inputs.messages]
    name = legacy.detect_template(templates.default.source)
    if name is None:
        raise EdgeInferError("this custom template is not supported, try using --jinja")
    prompt = legacy.format_chat(name, chat, inputs.add_generation_prompt)
    return ChatPrompt(prompt, ChatSyntax(format=FORMAT_CONTENT_ONLY))


def _legacy_text(msg: ChatMsg) -> str:
    text = msg.content
    for part in msg.content_parts:
        if part.type in ("text", "media_marker"):
            text += ("\n" if text else "") + part.text
    return text
