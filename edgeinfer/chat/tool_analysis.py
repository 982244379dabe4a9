"""What a chat template says about tool calls, found by rendering it: the tool-call half of
llama.cpp's differential template analysis (analyze_tools in common/chat-diff-analyzer.cpp).

An assistant message is rendered without and with a call of `FFF_FIRST_FUN_F` (arguments
`AA_ARG_FST_AA: "XXXX"`, `BB_ARG_SND_BB: "YYYY"`, id "call00001"); what the call adds is
the haystack. Where the names sit in it gives the format:

* JSON_NATIVE: the function name is a quoted JSON value (`{"name": "FFF_FIRST_FUN_F", ...}`);
  the call is read as JSON to learn its field names (name, arguments or parameters, id),
  whether it sits in a `[...]` array, and the markers around it (`<tool_call>`,
  `[TOOL_CALLS]`); one call against two says whether the markers wrap each call or all;
* TAG_WITH_JSON: only the argument names are quoted (`<function=NAME>{...}</function>`);
* TAG_WITH_TAGGED: neither is (`<parameter=NAME>value</parameter>`).

For the tag formats, more renderings (the other function, one argument, another value,
another id, no arguments) give the function-name markers, the argument markers, the
separator and where the call id goes. Templates the comparisons get wrong are patched
afterwards from TOOL_TEMPLATE_PATCHES, as llama.cpp's `workarounds` list does.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from edgeinfer.chat import peg
from edgeinfer.chat.diff import diff_split, trim
from edgeinfer.chat.probe import (
    ANALYSIS_TOOLS,
    ARG_FIRST,
    ARG_SECOND,
    ASSISTANT_MSG,
    FUN_FIRST,
    FUN_SECOND,
    USER,
    Comparison,
    Variant,
    compare,
    tool_call,
)
from edgeinfer.chat.render import ChatTemplate

JSON_NATIVE, TAG_WITH_JSON, TAG_WITH_TAGGED = "json_native", "tag_with_json", "tag_with_tagged"
# Where a call id goes in a tag format (call_id_position)
ID_NONE, ID_PRE_FUNC_NAME, ID_BETWEEN_FUNC_AND_ARGS, ID_POST_ARGS = (
    "none", "pre_func_name", "between_func_and_args", "post_args")
CALL_ID_001, CALL_ID_002, CALL_ID_999 = "call00001", "call00002", "call99999"

_BOTH_ARGS = {ARG_FIRST: "XXXX", ARG_SECOND: "YYYY"}
FIRST_CALL = tool_call(FUN_FIRST, _BOTH_ARGS, CALL_ID_001)
SECOND_CALL = tool_call(FUN_SECOND, _BOTH_ARGS, CALL_ID_002)


@dataclass
class ToolFormat:
    """The tool-call structure of a template (llama.cpp's tool_format_analysis,
    tool_function_analysis, tool_arguments_analysis and tool_id_analysis in one). `mode` is
    "" when the template has no tool calls or they were not understood."""

    mode: str = ""
    section_start: str = ""  # e.g. "<tool_call>", "[TOOL_CALLS]"
    section_end: str = ""
    per_call_start: str = ""  # markers around each call of a parallel call
    per_call_end: str = ""
    # JSON_NATIVE
    fun_name_is_key: bool = False  # {"<name>": {...arguments...}}
    tools_array_wrapped: bool = False  # [{...}, {...}]
    openai_wrapper_trigger: bool = False  # the model may write {"type": "function", ...}
    function_field: str = "function"
    name_field: str = "name"
    args_field: str = "arguments"
    id_field: str = ""
    gen_id_field: str = ""
    parameter_order: list[str] = field(default_factory=list)
    # tag formats: the function
    name_prefix: str = ""  # e.g. "<function="
    name_suffix: str = ""  # e.g. ">"
    args_separator: str = ""
    function_close: str = ""  # e.g. "</function>"
    # tag formats: the arguments
    args_start: str = ""
    args_end: str = ""
    arg_name_prefix: str = ""  # e.g. "<parameter="
    arg_name_suffix: str = ""
    arg_value_prefix: str = ""
    arg_value_suffix: str = ""  # e.g. "</parameter>"
    arg_separator: str = ""
    tolerate_intertag_whitespace: bool = False
    # tag formats: the call id
    call_id_pos: str = ID_NONE
    call_id_prefix: str = ""
    call_id_suffix: str = ""

    @property
    def trigger(self) -> str:
        """The marker a call starts with: where a lazy grammar starts."""
        return self.section_start or self.per_call_start

    def markers(self) -> list[str]:
        """The markers in llama.cpp's collect_preserved_tokens order."""
        return [self.section_start, self.section_end, self.per_call_start, self.per_call_end,
                self.name_prefix, self.name_suffix, self.args_separator, self.function_close,
                self.args_start, self.args_end, self.arg_name_prefix, self.arg_name_suffix,
                self.arg_separator, self.arg_value_prefix, self.arg_value_suffix,
                self.call_id_prefix, self.call_id_suffix]


def _calls(*calls: dict) -> list[dict]:
    return [USER, {"role": "assistant", "content": "", "tool_calls": list(calls)}]


def _compare_calls(tmpl: ChatTemplate, first: list[dict],
                   second: list[dict]) -> Comparison | None:
    """Two renderings that differ in the assistant message only."""
    return compare(tmpl, Variant(first, tools=ANALYSIS_TOOLS),
                   lambda v: replace(v, messages=second))


def _tags(parser: peg.Parser, text: str, anywhere: bool = True) -> tuple[bool, dict]:
    result, tags = peg.extract_tags(parser, text, anywhere=anywhere)
    return result.success, tags


def _lenient_find(text: str, needle: str) -> int:
    """std::string::find, with npos sorting last."""
    at = text.find(needle)
    return at if at != -1 else len(text) + 1


# -- the haystack and the format ----------------------------------------------------------------
def analyze_tools(tmpl: ChatTemplate, reasoning_start: str, reasoning_end: str) -> ToolFormat:
    """analyze_tools: the format of a template that renders tool calls."""
    fmt = ToolFormat()
    plain = [USER, {"role": "assistant", "content": ASSISTANT_MSG}]
    result = _compare_calls(tmpl, plain, _calls(FIRST_CALL))
    if result is None or not result.right:
        return fmt
    parallel = tmpl.caps.supports_parallel_tool_calls
    _call_format(tmpl, fmt, result.right, reasoning_start, reasoning_end, parallel)
    if fmt.mode in ("", JSON_NATIVE):
        return fmt
    if parallel:
        _per_call_markers(tmpl, fmt)
    _function_markers(tmpl, fmt)
    if fmt.mode == TAG_WITH_TAGGED:
        _argument_name_markers(tmpl, fmt)
        _argument_value_markers(tmpl, fmt)
    _argument_separator(tmpl, fmt)
    _call_id_markers(tmpl, fmt)
    return fmt


def _in_json(haystack: str, needle: str) -> bool:
    """The needle appears as a quoted JSON key or value."""
    quoted = peg.choice("{", ":") << peg.tag("dq", peg.literal(f'"{needle}"'))
    return _tags(quoted, haystack)[0]


def _call_format(tmpl: ChatTemplate, fmt: ToolFormat, haystack: str, reasoning_start: str,
                 reasoning_end: str, parallel: bool) -> None:
    """analyze_tool_call_format."""
    if _in_json(haystack, FUN_FIRST):
        fmt.mode = JSON_NATIVE
    elif _in_json(haystack, ARG_FIRST):
        fmt.mode = TAG_WITH_JSON
    else:
        fmt.mode = TAG_WITH_TAGGED
    clean = haystack
    for marker in (reasoning_start, reasoning_end):
        if marker and marker in clean:
            at = clean.find(marker)
            clean = clean[:at] + clean[at + len(marker):]
    if fmt.mode == JSON_NATIVE:
        _json_native(fmt, clean)
        if parallel:
            _json_native_parallel(tmpl, fmt)
    else:
        _tag_markers(fmt, clean)
    fmt.section_end, fmt.per_call_end = trim(fmt.section_end), trim(fmt.per_call_end)


def _json_native(fmt: ToolFormat, clean: str) -> None:
    """analyze_tool_call_format_json_native: the call's JSON fields and the markers around
    it."""
    json_start, json_end = clean.find("{"), clean.rfind("}")
    cut = clean[json_start:json_end + 1]
    try:
        call = json.loads(cut) if json_start != -1 else None
    except ValueError:
        call = None
    if not isinstance(call, dict):  # llama.cpp fails the whole template; calls stay unknown
        fmt.mode = ""
        return
    _json_fields(fmt, call)
    array = peg.tag("pre", peg.literal("[") + peg.space()) + peg.literal(cut) \
        + peg.tag("post", peg.space() + "]")
    wrapped, tags = _tags(array, clean)
    if wrapped:
        fmt.tools_array_wrapped = True
        json_start -= len(tags.get("pre", ""))
        json_end += len(tags.get("post", ""))
    json_end += 1
    fields = [f for f in (fmt.name_field, fmt.args_field, fmt.id_field, fmt.gen_id_field) if f]
    fmt.parameter_order = sorted(fields, key=lambda f: (_lenient_find(clean, f), f))
    fmt.section_start = clean[:json_start].lstrip(peg.SPACE_CHARS)
    fmt.section_end = trim(clean[json_end:])
    if fmt.tools_array_wrapped and fmt.section_end == "]":
        fmt.section_end = ""


def _json_fields(fmt: ToolFormat, call: dict) -> None:
    def register(prefix: str, key: str, value) -> None:
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, str) and "call0000" in value:
            fmt.id_field = name
        elif isinstance(value, str) and value == FUN_FIRST:
            fmt.name_field = name
        elif ARG_FIRST in json.dumps(value, ensure_ascii=False):
            fmt.args_field = name
        elif "id" in key:
            fmt.gen_id_field = name

    for key, value in call.items():
        if key == FUN_FIRST:
            fmt.fun_name_is_key, fmt.name_field, fmt.args_field = True, "", ""
            continue
        if isinstance(value, dict) and ARG_FIRST not in json.dumps(value, ensure_ascii=False):
            fmt.function_field = key
            for sub_key, sub_value in value.items():
                register(key, sub_key, sub_value)
        register("", key, value)


def _json_native_parallel(tmpl: ChatTemplate, fmt: ToolFormat) -> None:
    """analyze_json_native_parallel_calls: markers repeated for the second call wrap each
    call, not the section."""
    result = _compare_calls(tmpl, _calls(FIRST_CALL), _calls(FIRST_CALL, SECOND_CALL))
    if result is not None and fmt.section_start and fmt.section_start in result.right:
        fmt.per_call_start, fmt.per_call_end = fmt.section_start, fmt.section_end
        fmt.section_start = fmt.section_end = ""


# -- tag formats ----------------------------------------------------------------------------------
def _not_marker_text() -> peg.Parser:
    """Any text up to the next marker."""
    return peg.zero_or_more(peg.negate(peg.marker()) + peg.any_char())


def _tag_markers(fmt: ToolFormat, clean: str) -> None:
    """analyze_tool_call_format_non_json: up to two markers before the function (section and
    call), the same after it."""
    fun_marker_parser = peg.tag("fun_marker", peg.choice(
        peg.tag("fun_pre", "<" + peg.until(">", FUN_FIRST)) + FUN_FIRST
        + peg.tag("fun_post", peg.negate(peg.space() + "<") + peg.until(">") + ">")
        + peg.space(),
        peg.tag("fun_pre", "[" + peg.until("]", FUN_FIRST)) + FUN_FIRST
        + peg.tag("fun_post", peg.negate(peg.space() + "[" + peg.until("]") + "]")
                  + peg.space())))
    found, fun_tags = _tags(fun_marker_parser, clean)
    fun_marker = fun_tags.get("fun_marker", "") if found else FUN_FIRST
    marker = peg.marker() + peg.space()
    per_call = peg.tag("sec_start", marker) + peg.tag("call_start", marker) \
        + peg.tag("fun_pre", peg.until(fun_marker)) + fun_marker + peg.tag("rest", peg.rest())
    ok, tags = _tags(per_call, clean)
    if ok:
        closers = peg.tag("call_end", marker) + peg.tag("sec_end", marker) + peg.end()
        _, end_tags = _tags(closers, tags.get("rest", ""))
        fmt.name_prefix = fun_tags.get("fun_pre", "") + fmt.name_prefix
    else:
        section = peg.tag("sec_start", marker) + fun_marker + peg.tag("rest", peg.rest())
        _, tags = _tags(section, clean)
        _, end_tags = _tags(peg.tag("sec_end", marker) + peg.end(), tags.get("rest", ""))
    fmt.per_call_start, fmt.per_call_end = tags.get("call_start", ""), end_tags.get("call_end", "")
    fmt.section_start, fmt.section_end = tags.get("sec_start", ""), end_tags.get("sec_end", "")


def _per_call_markers(tmpl: ChatTemplate, fmt: ToolFormat) -> None:
    """check_per_call_markers: a section marker repeated for the second call is a per-call
    marker; a per-call end written once for two calls ends the section."""
    result = _compare_calls(tmpl, _calls(FIRST_CALL), _calls(FIRST_CALL, SECOND_CALL))
    if result is None:
        return
    second = diff_split(result.suffix, result.right).right.lstrip(peg.SPACE_CHARS)
    if fmt.section_start and second.startswith(fmt.section_start):
        fmt.per_call_start, fmt.per_call_end = fmt.section_start, fmt.section_end
        fmt.section_start = fmt.section_end = ""
    if fmt.per_call_end:
        one, two = (_count(out, fmt.per_call_end) for out in (result.output_a, result.output_b))
        if one > 0 and one == two:
            fmt.section_end, fmt.per_call_end = fmt.per_call_end, ""


def _count(text: str, needle: str) -> int:
    return text.count(needle)


def _function_markers(tmpl: ChatTemplate, fmt: ToolFormat) -> None:
    """extract_function_markers: the first call against the second gives the text around
    the function name; the text after the last argument value gives the closer."""
    result = _compare_calls(tmpl, _calls(FIRST_CALL), _calls(SECOND_CALL))
    if result is None or FUN_FIRST not in result.left or FUN_SECOND not in result.right:
        return
    prefix_marker = fmt.per_call_start or fmt.section_start
    if prefix_marker and prefix_marker in result.prefix:
        fmt.name_prefix = result.prefix[result.prefix.rfind(prefix_marker) + len(prefix_marker):]
    name = peg.tag("pre", peg.until(FUN_FIRST)) + FUN_FIRST + peg.tag("post", _not_marker_text())
    ok, tags = _tags(name, result.left, anywhere=False)
    if ok:
        fmt.name_prefix += tags.get("pre", "")
        fmt.name_suffix = tags.get("post", "")
    if fmt.mode == TAG_WITH_JSON:
        _json_name_suffix(fmt, result.suffix)
    else:
        _tagged_name_suffix(fmt, result.suffix)
    closer = _closer_text(tmpl, fmt, result)
    if closer:
        fmt.function_close = _function_close(fmt, closer)
    fmt.function_close = fmt.function_close.lstrip(peg.SPACE_CHARS)


def _json_name_suffix(fmt: ToolFormat, suffix: str) -> None:
    """JSON arguments: the name suffix runs to the first `{` or `[` that is not in a marker,
    if a marker follows the arguments."""
    non_json = peg.marker() | (peg.negate("{") + peg.negate("[") + peg.any_char())
    after_json = _not_marker_text() + peg.marker()
    ok, tags = _tags(peg.tag("ext", peg.zero_or_more(non_json)) + after_json, suffix,
                     anywhere=False)
    if ok:
        fmt.name_suffix += tags.get("ext", "")


def _tagged_name_suffix(fmt: ToolFormat, suffix: str) -> None:
    """Tagged arguments: the name suffix runs to the first marker; what separates it from
    the first argument's marker is the arguments separator."""
    ok, tags = _tags(peg.tag("ext", _not_marker_text()), suffix, anywhere=False)
    if not ok:
        return
    ext = tags.get("ext", "")
    fmt.name_suffix += ext
    arg_start = peg.marker() + peg.space() + peg.choice(ARG_FIRST, ARG_SECOND)
    sep = peg.tag("sep", peg.zero_or_more(peg.negate(arg_start) + peg.any_char())) + arg_start
    ok, tags = _tags(sep, suffix[len(ext):], anywhere=False)
    if ok:
        fmt.args_separator = trim(tags.get("sep", ""))


def _closer_text(tmpl: ChatTemplate, fmt: ToolFormat, result: Comparison) -> str:
    """The text between the last argument and the call or section end marker (without
    one, what a call adds at the end compared with plain content)."""
    suffix_marker = fmt.per_call_end or fmt.section_end
    if suffix_marker:
        at = result.suffix.find(suffix_marker)
        return result.suffix[:at] if at != -1 else result.suffix
    plain = [USER, {"role": "assistant", "content": ASSISTANT_MSG}]
    no_call = _compare_calls(tmpl, _calls(FIRST_CALL), plain)
    if no_call is None:
        return ""
    at = no_call.left.find("YYYY")
    return no_call.left[at + 4:] if at != -1 else no_call.left[3:]


def _function_close(fmt: ToolFormat, closer: str) -> str:
    after_value = peg.until("YYYY") + "YYYY"
    if fmt.mode == TAG_WITH_TAGGED:
        parser = after_value + peg.space() + peg.marker() + peg.space() \
            + peg.tag("close", peg.rest())
        ok, tags = _tags(parser, closer, anywhere=False)
        return tags.get("close", "") if ok else fmt.function_close
    ok, tags = _tags(after_value + peg.tag("post_val", peg.rest()), closer, anywhere=False)
    post = tags.get("post_val", "") if ok else ""
    at = max(post.rfind("}"), post.rfind("]"))
    if ok and at != -1 and at < len(post) - 1:
        return post[at + 1:].lstrip(peg.SPACE_CHARS)
    return fmt.function_close


def _last_marker() -> peg.Parser:
    """The last marker of a text and anything after it up to the end."""
    return peg.marker() + _not_marker_text() + peg.end()


def _argument_name_markers(tmpl: ChatTemplate, fmt: ToolFormat) -> None:
    """extract_argument_name_markers: one argument against the other."""
    result = _compare_calls(tmpl, _calls(tool_call(FUN_FIRST, {ARG_FIRST: "XXXX"})),
                            _calls(tool_call(FUN_FIRST, {ARG_SECOND: "YYYY"})))
    if result is None or not result.left or not result.right:
        return
    left = peg.tag("pre", peg.until(ARG_FIRST)) + ARG_FIRST + peg.tag("suffix", peg.until('"', "X"))
    right = peg.tag("pre", peg.until(ARG_SECOND)) + ARG_SECOND \
        + peg.tag("suffix", peg.until('"', "Y"))
    left_ok, left_tags = _tags(left, result.left)
    right_ok, right_tags = _tags(right, result.right)
    if left_ok and right_ok and left_tags.get("pre") \
            and left_tags.get("pre") == right_tags.get("pre") \
            and left_tags.get("suffix", "") == right_tags.get("suffix", ""):
        fmt.arg_name_prefix, fmt.arg_name_suffix = left_tags["pre"], left_tags.get("suffix", "")
    elif result.left.startswith(ARG_FIRST) and result.right.startswith(ARG_SECOND):
        last = peg.zero_or_more(peg.negate(_last_marker()) + peg.any_char()) \
            + peg.tag("name_prefix", _last_marker())
        ok, tags = _tags(last, result.prefix, anywhere=False)
        fmt.arg_name_prefix = tags.get("name_prefix", "") if ok else result.prefix
        after_first = result.left[len(ARG_FIRST):] + result.suffix
        suffix = peg.tag("suffix", _not_marker_text() + peg.marker() + peg.space())
        ok, tags = _tags(suffix, after_first)
        if ok:
            fmt.arg_name_suffix = tags.get("suffix", "")


def _argument_value_markers(tmpl: ChatTemplate, fmt: ToolFormat) -> None:
    """extract_argument_value_markers: one value against another."""
    result = _compare_calls(tmpl, _calls(tool_call(FUN_FIRST, {ARG_FIRST: "XXXX"})),
                            _calls(tool_call(FUN_FIRST, {ARG_FIRST: "YYYY"})))
    if result is None or result.left != "XXXX" or result.right != "YYYY":
        return
    prefix, name_end = result.prefix, ARG_FIRST + fmt.arg_name_suffix
    if name_end in prefix:
        prefix = prefix[prefix.rfind(name_end) + len(name_end):]
    if prefix:
        last = peg.zero_or_more(peg.negate(_last_marker()) + peg.any_char()) \
            + peg.tag("val_prefix", _last_marker())
        ok, tags = _tags(last, prefix, anywhere=False)
        fmt.arg_value_prefix = tags.get("val_prefix", "") if ok else prefix
    value_suffix = result.suffix
    end_marker = fmt.function_close or fmt.per_call_end or fmt.section_end
    if end_marker and end_marker in value_suffix:
        value_suffix = value_suffix[:value_suffix.find(end_marker)]
    if trim(value_suffix):
        fmt.arg_value_suffix = value_suffix


def _until_common_prefix(full: str, left: str, right: str) -> str:
    """What comes before the common prefix of left and right in full."""
    common = 0
    while common < min(len(left), len(right)) and left[common] == right[common]:
        common += 1
    at = full.find(left[:common]) if common else -1
    return full[:at] if at != -1 else ""


def _after_common_suffix(full: str, left: str, right: str) -> str:
    """What comes after the last common suffix of left and right in full."""
    common = 0
    while common < min(len(left), len(right)) and left[-1 - common] == right[-1 - common]:
        common += 1
    at = full.rfind(left[len(left) - common:]) if common else -1
    return full[at + common:] if at != -1 else ""


def _argument_separator(tmpl: ChatTemplate, fmt: ToolFormat) -> None:
    """extract_argument_separator: what comes between two arguments. (llama.cpp's
    extract_args_markers only acts on JSON_NATIVE, for which it is never called.)"""
    one_arg = tool_call(FUN_FIRST, {ARG_FIRST: "XXXX"})
    result = _compare_calls(tmpl, _calls(one_arg), _calls(FIRST_CALL))
    if result is not None and result.right:
        fmt.arg_separator = _until_common_prefix(result.right, ARG_FIRST, ARG_SECOND)


def _call_id_markers(tmpl: ChatTemplate, fmt: ToolFormat) -> None:
    """extract_call_id_markers: one call id against another; where the function name and
    the arguments fall around the difference says where the id goes."""
    other_id = tool_call(FUN_FIRST, _BOTH_ARGS, CALL_ID_999)
    result = _compare_calls(tmpl, _calls(FIRST_CALL), _calls(other_id))
    if result is None or (not result.left and not result.right):
        return
    common_id = "call"  # the common prefix of call00001 and call99999
    in_prefix = result.prefix.rfind(FUN_FIRST)
    in_suffix = result.suffix.find(FUN_FIRST)
    if in_prefix != -1 and in_suffix == -1:
        _call_id_after_name(fmt, result, in_prefix, common_id)
    elif in_suffix != -1 and in_prefix == -1:
        fmt.call_id_pos = ID_PRE_FUNC_NAME
        fmt.call_id_prefix = _find_last_marker(result.prefix)
        fmt.call_id_suffix = _find_first_marker(result.suffix[:in_suffix])
    if fmt.call_id_prefix == fmt.args_end:
        fmt.call_id_prefix = ""
    if fmt.call_id_suffix == fmt.args_start:
        fmt.call_id_suffix = ""
    if fmt.call_id_pos != ID_NONE and fmt.call_id_suffix \
            and fmt.per_call_end.startswith(fmt.call_id_suffix):
        fmt.per_call_end = ""


def _call_id_after_name(fmt: ToolFormat, result: Comparison, name_at: int,
                        common_id: str) -> None:
    args_in_prefix = result.prefix.find("{", name_at)
    args_in_suffix = result.suffix.find("{")
    if args_in_suffix != -1 and args_in_prefix == -1:
        fmt.call_id_pos = ID_BETWEEN_FUNC_AND_ARGS
        after_func = result.prefix[name_at + len(FUN_FIRST):]
        id_prefix = peg.tag("prefix", peg.marker()) + peg.zero_or_more(
            peg.negate(peg.marker()) + peg.negate(common_id) + peg.any_char()) + common_id
        ok, tags = _tags(id_prefix, after_func)
        fmt.call_id_prefix = tags.get("prefix", "") if ok else _find_last_marker(after_func)
        id_suffix = peg.zero_or_more(peg.negate(peg.marker()) + peg.negate("{")
                                     + peg.any_char()) + peg.tag("suffix", peg.marker())
        ok, tags = _tags(id_suffix, result.suffix)
        if ok:
            fmt.call_id_suffix = tags.get("suffix", "")
    elif args_in_prefix != -1:
        fmt.call_id_pos = ID_POST_ARGS
        after_args = result.prefix[args_in_prefix:]
        brace = after_args.rfind("}")
        if brace != -1:
            fmt.call_id_prefix = _find_last_marker(after_args[brace + 1:])
        fmt.call_id_suffix = _find_first_marker(result.suffix)


def _find_last_marker(text: str) -> str:
    parser = peg.zero_or_more(peg.negate(_last_marker()) + peg.any_char()) \
        + peg.tag("m", peg.marker())
    ok, tags = _tags(parser, text)
    return tags.get("m", "") if ok else ""


def _find_first_marker(text: str) -> str:
    ok, tags = _tags(peg.tag("m", peg.marker()), text)
    return tags.get("m", "") if ok else ""


# -- known templates ------------------------------------------------------------------------------
def _functionary_31(src: str, fmt: ToolFormat) -> None:
    if ('set has_code_interpreter = tools | selectattr("type", "equalto", '
            '"code_interpreter") | list | length > 0') in src:
        fmt.name_prefix = fmt.section_start = fmt.section_end = fmt.function_close = ""
        fmt.per_call_start, fmt.per_call_end = "<function=", "</function>"


def _deepseek_r1_distill_qwen(src: str, fmt: ToolFormat) -> None:
    if ("{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + "
            "'<｜tool▁sep｜>'") in src:
        fmt.section_start, fmt.section_end = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
        fmt.per_call_start = "<｜tool▁call▁begin｜>function"
        fmt.name_prefix, fmt.per_call_end = "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
        fmt.function_close = "```"


def _nemotron_nano_v2(src: str, fmt: ToolFormat) -> None:
    if all(s in src for s in ("<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>", "<TOOL_RESPONSE>")):
        fmt.mode, fmt.section_start, fmt.section_end = JSON_NATIVE, "", ""
        fmt.per_call_start, fmt.per_call_end = "<TOOLCALL>", "</TOOLCALL>"
        fmt.tools_array_wrapped = True


def _json_name_parameters(src: str, fmt: ToolFormat) -> None:
    """Llama 3.x: the template asks for {"name", "parameters"} and the model may write the
    OpenAI {"type": "function", ...} wrapper around it."""
    if 'Respond in the format {"name": function name' in src and "Do not use variables." in src:
        fmt.openai_wrapper_trigger = True


def _laguna(src: str, fmt: ToolFormat) -> None:
    if "laguna_glm_thinking" in src:
        fmt.arg_value_prefix, fmt.arg_value_suffix = trim(fmt.arg_value_prefix), \
            trim(fmt.arg_value_suffix)
        fmt.arg_separator = trim(fmt.arg_separator)
        fmt.tolerate_intertag_whitespace = True


def _bailing_v3(src: str, fmt: ToolFormat) -> None:
    if "Bailing V3 chat template" in src:
        fmt.arg_value_suffix = trim(fmt.arg_value_suffix)
        fmt.tolerate_intertag_whitespace = True


# The tool-call entries of llama.cpp's `workarounds` list, in its order.
TOOL_TEMPLATE_PATCHES: tuple[Callable[[str, ToolFormat], None], ...] = (
    _functionary_31, _deepseek_r1_distill_qwen, _nemotron_nano_v2, _json_name_parameters,
    _laguna, _bailing_v3,
)
