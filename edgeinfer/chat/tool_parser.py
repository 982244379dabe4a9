"""The grammar of an assistant message that may call tools, one builder per tool-call format
(analyze_tools::build_parser in common/chat-auto-parser-generator.cpp and
common_chat_peg_builder::standard_json_tools in common/chat-peg-parser.cpp).

Every builder reads: the reasoning (if extracted), optional content up to the format's
call marker, the calls, the end. The calls are `trigger_rule`s: a lazy grammar starts at
them. Each tool gets its own alternative whose name is a literal and whose arguments follow
the tool's `parameters` schema, so the grammar only admits declared tools with valid
arguments. Under tool_choice "required" the calls are not optional; `parallel_tool_calls`
allows more than one.

The parse side tags what the mapper (mapper.py) turns into tool calls: `tool-open` and
`tool-close` around a call, `tool-name`, `tool-id`, `tool-args` (a JSON object) or tagged
arguments (`tool-arg-name`, `tool-arg-value`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from edgeinfer.chat import peg
from edgeinfer.chat.mapper import (
    CONTENT,
    TOOL_ARG_CLOSE,
    TOOL_ARG_NAME,
    TOOL_ARG_OPEN,
    TOOL_ARG_STRING_VALUE,
    TOOL_ARG_VALUE,
    TOOL_ARGS,
    TOOL_CLOSE,
    TOOL_ID,
    TOOL_NAME,
    TOOL_OPEN,
)
from edgeinfer.chat.tool_analysis import (
    ID_BETWEEN_FUNC_AND_ARGS,
    JSON_NATIVE,
    TAG_WITH_JSON,
    TAG_WITH_TAGGED,
    ToolFormat,
)


def _atomic_tag(name: str, item: peg.Parser | str) -> peg.Parser:
    """tool_open, tool_close, tool_name, tool_id, ...: only shown once complete."""
    return peg.atomic(peg.tag(name, item))


def _json_key(key: str) -> peg.Parser:
    return peg.literal(f'"{key}"') + peg.space() + ":" + peg.space()


def tool_functions(tools) -> Iterator[tuple[str, dict]]:
    """foreach_function: each function tool's name and parameters schema (an empty or
    missing schema takes no arguments: common_chat_tool_parameters)."""
    for tool in tools:
        if tool.get("type") != "function" or "function" not in tool:
            continue
        function = tool["function"]
        params = function.get("parameters")
        if params is None or params == {}:
            params = {"type": "object", "properties": {}}
        yield function["name"], params


def _arguments(name: str, params: dict) -> peg.Parser:
    return peg.tag(TOOL_ARGS, peg.schema(peg.json_value(), f"tool-{name}-schema", params))


def _id_value() -> peg.Parser:
    return peg.choice('"' + _atomic_tag(TOOL_ID, peg.string_content('"')) + '"',
                      _atomic_tag(TOOL_ID, peg.json_number()))


# -- standard_json_tools --------------------------------------------------------------------------
def standard_json_tools(section_start: str, section_end: str, tools, *, parallel: bool,
                        force: bool, name_key: str = "", args_key: str = "",
                        array_wrapped: bool = False, function_is_key: bool = False,
                        call_id_key: str = "", gen_call_id_key: str = "",
                        parameters_order: tuple[str, ...] = (),
                        accept_openai_wrapper: bool = False) -> peg.Parser:
    """Calls written as JSON objects between `section_start` and `section_end`: the name
    and arguments as fields (dotted keys are nested: "function.name"), or the name as the
    key of the arguments."""
    if not tools:
        return peg.eps()
    name_key, args_key_or_default = name_key or "name", args_key or "arguments"
    if function_is_key:
        choices = _function_is_key(tools, args_key, args_key_or_default, call_id_key,
                                   gen_call_id_key)
    elif "." in name_key or "." in args_key_or_default:
        choices = _nested_keys(tools, name_key, args_key_or_default, call_id_key,
                               gen_call_id_key)
    else:
        choices = _flat_keys(tools, name_key, args_key_or_default, call_id_key,
                             gen_call_id_key, parameters_order, accept_openai_wrapper)
    calls = choices
    if parallel:
        calls = calls + peg.zero_or_more(peg.space() + "," + peg.space() + choices)
    if array_wrapped:
        calls = "[" + peg.space() + calls + peg.space() + "]"
    section = peg.trigger_rule("tool-call", peg.literal(section_start) + peg.space() + calls
                               + peg.space() + peg.literal(section_end))
    return section if force else peg.optional(section)


def _function_is_key(tools, args_key: str, args_key_or_default: str, call_id_key: str,
                     gen_call_id_key: str) -> peg.Parser:
    """{"<name>": {"id": ..., "<args_key>": {...}}} or {"<name>": {...arguments...}}."""
    alternatives = []
    for name, params in tool_functions(tools):
        fields = []
        if call_id_key:
            id_field = peg.atomic(_json_key(call_id_key) + '"'
                                  + _atomic_tag(TOOL_ID, peg.string_content('"')) + '"')
            fields.append(peg.optional(id_field + peg.space()
                                       + peg.optional("," + peg.space())))
        if gen_call_id_key:
            gen_id = peg.atomic(_json_key(gen_call_id_key) + _id_value())
            fields.append(peg.optional(gen_id + peg.space() + peg.optional("," + peg.space())))
        args = _arguments(name, params)
        fields.append(_json_key(args_key_or_default) + args if args_key else args)
        if not args_key and len(fields) == 1:
            inner = fields[0]
        else:
            inner = "{" + peg.space()
            for i, item in enumerate(fields):
                inner = inner + item + (peg.space() if i < len(fields) - 1 else peg.eps())
            inner = inner + peg.space() + "}"
        call = _atomic_tag(TOOL_OPEN, "{") + peg.space() + '"' + _atomic_tag(TOOL_NAME, name) \
            + '"' + peg.space() + ":" + peg.space() + inner + peg.space() \
            + _atomic_tag(TOOL_CLOSE, "}")
        alternatives.append(peg.rule(f"tool-{name}", peg.tag("tool", call)))
    return peg.choice(*alternatives)


def _split_key(key: str) -> tuple[str, str]:
    head, dot, tail = key.partition(".")
    return (head, tail) if dot else ("", key)


def _nested_keys(tools, name_key: str, args_key: str, call_id_key: str,
                 gen_call_id_key: str) -> peg.Parser:
    """{"id": ..., "function": {"name": ..., "arguments": {...}}}."""
    name_prefix, name_field = _split_key(name_key)
    args_prefix, args_field = _split_key(args_key)
    prefix = name_prefix or args_prefix
    alternatives = []
    for name, params in tool_functions(tools):
        nested = "{" + peg.space() + _json_key(name_field) \
            + peg.atomic('"' + _atomic_tag(TOOL_NAME, name) + '"') + peg.space() + "," \
            + peg.space() + _json_key(args_field) + _arguments(name, params) + peg.space() + "}"
        body = _atomic_tag(TOOL_OPEN, "{") + peg.space()
        if call_id_key and "." not in call_id_key:
            id_field = peg.atomic(_json_key(call_id_key) + '"'
                                  + _atomic_tag(TOOL_ID, peg.string_content('"')) + '"')
            body = body + peg.optional(id_field + peg.space() + "," + peg.space())
        if gen_call_id_key and "." not in gen_call_id_key:
            gen_id = peg.atomic(_json_key(gen_call_id_key) + _id_value())
            body = body + peg.optional(gen_id + peg.space() + "," + peg.space())
        body = body + _json_key(prefix) + nested + peg.space() + _atomic_tag(TOOL_CLOSE, "}")
        alternatives.append(peg.rule(f"tool-{name}", peg.tag("tool", body)))
    return peg.choice(*alternatives)


def _flat_keys(tools, name_key: str, args_key: str, call_id_key: str, gen_call_id_key: str,
               order: tuple[str, ...], accept_openai_wrapper: bool) -> peg.Parser:
    """{"name": ..., "arguments": {...}, "id": ...} with the fields in the template's order."""
    alternatives = []
    for name, params in tool_functions(tools):
        fields = [(_json_key(name_key) + peg.atomic('"' + _atomic_tag(TOOL_NAME, name) + '"'),
                   name_key), (_json_key(args_key) + _arguments(name, params), args_key)]
        for key in (call_id_key, gen_call_id_key):
            if key:
                fields.append((peg.optional(peg.atomic(_json_key(key) + _id_value())), key))
        fields.sort(key=lambda item: order.index(item[1]) if item[1] in order else len(order))
        body = _atomic_tag(TOOL_OPEN, "{") + peg.space()
        if accept_openai_wrapper:
            body = body + peg.optional(_json_key("type") + '"function"' + peg.space() + ","
                                       + peg.space())
        for i, (item, _) in enumerate(fields):
            body = body + item
            if i < len(fields) - 1:
                body = body + peg.space() + "," + peg.space()
        body = body + peg.space() + _atomic_tag(TOOL_CLOSE, "}")
        alternatives.append(peg.rule(f"tool-{name}", peg.tag("tool", body)))
    return peg.choice(*alternatives)


# -- the formats ----------------------------------------------------------------------------------
def _content_before(trigger: str, tool_choice: str = "auto") -> peg.Parser:
    """Text before the calls. Under "required" (and a named function) the calls come first:
    llama.cpp's grammar allows text before them there too, with which a small model writes
    until max_tokens and never calls; OpenAI's required means a call."""
    if tool_choice == "required":
        return peg.eps()
    return peg.optional(peg.tag(CONTENT, peg.until(trigger) if trigger else peg.eps()))


def json_native(syntax, reasoning: peg.Parser) -> peg.Parser:
    """build_tool_parser_json_native: JSON calls, alone or between markers."""
    fmt: ToolFormat = syntax.tool_format
    name_field, args_field = fmt.name_field, fmt.args_field
    if fmt.function_field and fmt.function_field != "function" and "." not in name_field:
        name_field = f"{fmt.function_field}.{name_field}"
        args_field = f"{fmt.function_field}.{args_field}"
    options = dict(parallel=syntax.parallel_tool_calls, force=syntax.tool_choice == "required",
                   name_key=name_field, args_key=args_field,
                   array_wrapped=fmt.tools_array_wrapped, function_is_key=fmt.fun_name_is_key,
                   call_id_key=fmt.id_field, gen_call_id_key=fmt.gen_id_field,
                   parameters_order=tuple(fmt.parameter_order),
                   accept_openai_wrapper=fmt.openai_wrapper_trigger)
    if not fmt.section_start and fmt.per_call_start:
        single = standard_json_tools(fmt.per_call_start, fmt.per_call_end, syntax.tools,
                                     **options)
        # llama.cpp repeats a marked call even without parallel_tool_calls; here that
        # means one call, as OpenAI's flag does (a small model would otherwise call again
        # and again until max_tokens)
        repeat = peg.one_or_more if syntax.parallel_tool_calls else (lambda p: p)
        calls = peg.trigger_rule("tool-calls", repeat(single + peg.space()))
    else:
        calls = standard_json_tools(fmt.section_start, fmt.section_end, syntax.tools, **options)
    if syntax.content_start and syntax.content_end:
        wrapped = peg.optional(syntax.content_start
                               + peg.tag(CONTENT, peg.until(syntax.content_end))
                               + syntax.content_end)
        return reasoning + wrapped + calls + peg.end()
    return reasoning + _content_before(fmt.trigger or "{", syntax.tool_choice) + calls \
        + peg.end()


def _function(fmt: ToolFormat, name: str, call_id: peg.Parser, have_call_id: bool,
              args: peg.Parser, atomic_peek: peg.Parser | None) -> peg.Parser:
    """build_func_parser: the function's name between its markers, the call id, the
    arguments, the closer; atomic where a partial call must not show yet."""
    opening = _atomic_tag(TOOL_OPEN, fmt.name_prefix + _atomic_tag(TOOL_NAME, name)
                          + fmt.name_suffix)
    if fmt.args_separator:
        opening = opening + peg.space() + fmt.args_separator
    matched_atomic = True
    if fmt.name_suffix:
        function = opening + call_id + peg.space() + args
    elif have_call_id:
        function = peg.atomic(opening + call_id) + peg.space() + args
    elif atomic_peek is not None:
        function = peg.atomic(opening + call_id + peg.space() + atomic_peek) + args
    else:
        function, matched_atomic = opening + call_id + peg.space() + args, False
    if fmt.function_close:
        function = function + peg.space() + _atomic_tag(TOOL_CLOSE, fmt.function_close)
    elif fmt.per_call_end:
        ahead = peg.space() + fmt.per_call_end if fmt.tolerate_intertag_whitespace \
            else peg.literal(fmt.per_call_end)
        function = function + _atomic_tag(TOOL_CLOSE, peg.peek(ahead))
    else:
        function = function + _atomic_tag(TOOL_CLOSE, peg.space())
    return function if matched_atomic else peg.atomic(function)


def _call_id_section(fmt: ToolFormat, tagged: bool) -> tuple[peg.Parser, bool]:
    if fmt.call_id_pos != ID_BETWEEN_FUNC_AND_ARGS or not fmt.call_id_prefix \
            or not (fmt.call_id_suffix or fmt.args_start):
        return peg.eps(), False
    if fmt.call_id_suffix:
        value = fmt.call_id_prefix + _atomic_tag(TOOL_ID, peg.until(fmt.call_id_suffix))
        if tagged:
            return peg.optional(value + fmt.call_id_suffix), True
        return peg.optional(value) + fmt.call_id_suffix, True
    return peg.optional(fmt.call_id_prefix
                        + _atomic_tag(TOOL_ID, peg.until(fmt.args_start))), True


def _tag_calls(syntax, fmt: ToolFormat, choice: peg.Parser, reasoning: peg.Parser,
               tagged: bool) -> peg.Parser:
    """The calls of a tag format around the per-tool alternatives."""
    gap = peg.space() if tagged else peg.eps()
    if fmt.per_call_start:
        one = fmt.per_call_start + gap + choice + gap + fmt.per_call_end
        more = peg.zero_or_more(peg.space() + one) if syntax.parallel_tool_calls else peg.eps()
        calls = peg.trigger_rule("tool-call", one + more + gap)
        if fmt.section_start:
            end = (peg.literal(fmt.section_end) + gap) if fmt.section_end else peg.end()
            calls = peg.trigger_rule("tool-calls", peg.literal(fmt.section_start) + peg.space()
                                     + calls + peg.space() + end)
    else:
        more = peg.zero_or_more(", " + choice) if syntax.parallel_tool_calls else peg.eps()
        calls = peg.trigger_rule("tool-call", fmt.section_start + gap + choice + more + gap
                                 + fmt.section_end)
    if syntax.tool_choice != "required":
        calls = peg.optional(calls)
    return reasoning + _content_before(fmt.trigger, syntax.tool_choice) + calls + peg.end()


def tag_with_json(syntax, reasoning: peg.Parser) -> peg.Parser:
    """build_tool_parser_tag_json: `<function=NAME>{...}</function>` and the like."""
    fmt: ToolFormat = syntax.tool_format
    alternatives = []
    for name, params in tool_functions(syntax.tools):
        call_id, have_call_id = _call_id_section(fmt, tagged=False)
        args = _arguments(name, params)
        if fmt.args_start:
            args = fmt.args_start + args
        if fmt.args_end:
            args = args + fmt.args_end
        peek = peg.peek(fmt.args_start) if fmt.args_start else None
        alternatives.append(peg.rule(f"tool-{name}", _function(fmt, name, call_id,
                                                               have_call_id, args, peek)))
    return _tag_calls(syntax, fmt, peg.choice(*alternatives), reasoning, tagged=False)


def tag_with_tagged(syntax, reasoning: peg.Parser) -> peg.Parser:
    """build_tool_parser_tag_tagged: `<parameter=NAME>value</parameter>` arguments, required
    ones in order, optional ones in any order after them."""
    fmt: ToolFormat = syntax.tool_format
    until_suffix = peg.rule("until-suffix", peg.until(fmt.arg_value_suffix))
    alternatives = []
    for name, params in tool_functions(syntax.tools):
        required, optional = _tagged_arguments(fmt, name, params, until_suffix)
        args = peg.eps()
        for i, item in enumerate(required):
            args = args + (peg.space() if i else peg.eps()) + item
        if optional:
            args = args + peg.zero_or_more(peg.space() + peg.choice(*optional))
        if fmt.args_start:
            args = fmt.args_start + args
        if fmt.args_end:
            args = args + fmt.args_end
        call_id, have_call_id = _call_id_section(fmt, tagged=True)
        peek = peg.peek(fmt.arg_name_prefix) if fmt.arg_name_prefix and required else None
        alternatives.append(peg.rule(f"tool-{name}", _function(fmt, name, call_id,
                                                               have_call_id, args, peek)))
    return _tag_calls(syntax, fmt, peg.choice(*alternatives), reasoning, tagged=True)


def _tagged_arguments(fmt: ToolFormat, name: str, params: dict,
                      until_suffix: peg.Parser) -> tuple[list, list]:
    required, optional = [], []
    properties = params.get("properties") if isinstance(params, dict) else None
    wanted = set(params.get("required") or ()) if isinstance(params, dict) else set()
    for arg, arg_schema in (properties or {}).items():
        opening = _atomic_tag(TOOL_ARG_OPEN, fmt.arg_name_prefix
                              + _atomic_tag(TOOL_ARG_NAME, arg) + fmt.arg_name_suffix)
        close = _atomic_tag(TOOL_ARG_CLOSE, fmt.arg_value_suffix)
        if may_be_string(arg_schema, params):
            value = peg.through(peg.tag(TOOL_ARG_STRING_VALUE, until_suffix) + close,
                                fmt.arg_value_suffix)
        else:
            value_schema = _with_definitions(arg_schema, params)
            value = peg.tag(TOOL_ARG_VALUE, peg.schema(
                peg.json_value(), f"tool-{name}-arg-{arg}-schema", value_schema)) + close
        item = peg.tag("tool-arg", opening + fmt.arg_value_prefix + value)
        (required if arg in wanted else optional).append(peg.rule(f"tool-{name}-arg-{arg}",
                                                                  item))
    return required, optional


def _with_definitions(schema, root: dict):
    """A property's schema keeps the definitions its `$ref`s point into."""
    if not isinstance(schema, dict):
        return schema
    extra = {k: root[k] for k in ("$defs", "definitions") if k in root and k not in schema}
    return {**schema, **extra}


def may_be_string(schema, root: dict, seen: frozenset = frozenset()) -> bool:
    """common_chat_schema::may_be_string: could a value of this schema be a string?"""
    if schema is True or schema == {} or not isinstance(schema, dict):
        return False
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return ref not in seen and may_be_string(_resolve(ref, root), root, seen | {ref})
    if "const" in schema:
        return isinstance(schema["const"], str)
    if "enum" in schema:
        return any(isinstance(v, str) for v in schema["enum"] or ())
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return any(may_be_string(s, root, seen) for s in schema[key] or ())
    if "allOf" in schema:
        parts = [s for s in schema["allOf"] or () if s not in (True, {})]
        return bool(parts) and all(may_be_string(s, root, seen) for s in parts)
    kind = schema.get("type")
    return kind == "string" or (isinstance(kind, list) and "string" in kind)


def _resolve(ref: str, root: dict):
    node = root
    for part in ref.lstrip("#").strip("/").split("/") if ref.startswith("#") else ():
        node = node.get(part) if isinstance(node, dict) else None
    return node if ref.startswith("#") else None


# tool format -> (syntax, reasoning parser) -> the grammar after the prefix
TOOL_PARSERS: dict[str, Callable[..., peg.Parser]] = {
    JSON_NATIVE: json_native, TAG_WITH_JSON: tag_with_json, TAG_WITH_TAGGED: tag_with_tagged,
}
