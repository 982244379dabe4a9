"""What a chat template can render, found by running it on probe conversations.

llama.cpp's common/jinja/caps.cpp: the template is executed on a few fixed inputs while its
engine records which input values were read ("used") and how (tested with `is string`,
indexed, iterated, filtered). The answers decide how messages are shaped before rendering
(chat.cpp): a system message the template never reads is merged into the next message, string
or typed (array-of-parts) content is converted to what the template reads, a null content is
replaced by "" when the template renders tool calls, and tool-call arguments are parsed into
objects when the template reads their fields.

Here the probes are wrapped in dict/list/str subclasses that record the same events while
jinja2 renders them. The ops recorded are the ones caps.cpp asks about: "array_access" (an
integer index or iteration), "test_is_string", and the name of any filter applied.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any

import jinja2
from jinja2 import meta

from edgeinfer.chat.template import compile_in, compile_template, hf_environment
from edgeinfer.errors import EdgeInferError


@dataclass(frozen=True)
class TemplateCaps:
    """jinja::caps, with llama.cpp's defaults."""

    supports_tools: bool = True
    supports_tool_calls: bool = True
    supports_system_role: bool = True
    supports_parallel_tool_calls: bool = True
    supports_preserve_reasoning: bool = False
    supports_reasoning_effort: bool = False
    supports_string_content: bool = True
    supports_typed_content: bool = False
    supports_object_arguments: bool = False

    def to_map(self) -> dict[str, bool]:
        """The map llama-server reports in /props' chat_template_caps."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


class _Stats:
    __slots__ = ("used", "ops")

    def __init__(self):
        self.used, self.ops = False, set()


def _tracked(value: Any) -> bool:
    return isinstance(value, (_TrackedStr, _TrackedList, _TrackedDict))


def _mark(value: Any, op: str | None = None, deep: bool = False) -> None:
    if _tracked(value):
        stats = value._caps_stats
        stats.used = True
        if op:
            stats.ops.add(op)
    if deep and isinstance(value, (dict, list)):  # used, without recording an access op
        for item in dict.values(value) if isinstance(value, dict) else list.__iter__(value):
            _mark(item, deep=True)


class _TrackedStr(str):
    def __new__(cls, text: str):
        obj = super().__new__(cls, text)
        obj._caps_stats = _Stats()
        return obj

    def __getitem__(self, index):
        if isinstance(index, int):
            _mark(self, "array_access")
        return str.__getitem__(self, index)

    def __iter__(self):
        _mark(self, "array_access")
        return str.__iter__(self)


class _TrackedList(list):
    def __init__(self, items):
        super().__init__(items)
        self._caps_stats = _Stats()

    def __getitem__(self, index):
        item = list.__getitem__(self, index)
        _mark(self, "array_access" if isinstance(index, int) else None)
        if isinstance(index, int):
            _mark(item)
        return item

    def __iter__(self):
        _mark(self, "array_access")
        return list.__iter__(self)


class _TrackedDict(dict):
    def __init__(self, items):
        super().__init__(items)
        self._caps_stats = _Stats()

    def __getitem__(self, key):
        value = dict.__getitem__(self, key)
        _mark(self, "object_access")
        _mark(value)
        return value

    def get(self, key, default=None):
        return self[key] if key in self else default

    def items(self):
        _mark(self, "object_access")
        for value in dict.values(self):
            _mark(value)
        return dict.items(self)

    def values(self):
        return [value for _, value in self.items()]


def _track(value: Any) -> Any:
    """A copy of JSON-like data whose every dict, list and string records its use."""
    if isinstance(value, dict):
        return _TrackedDict({k: _track(v) for k, v in value.items()})
    if isinstance(value, list):
        return _TrackedList([_track(v) for v in value])
    if isinstance(value, str):
        return _TrackedStr(value)
    return value


def _untrack(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _untrack(v) for k, v in dict.items(value)}
    if isinstance(value, list):
        return [_untrack(v) for v in list.__iter__(value)]
    return str(value) if isinstance(value, _TrackedStr) else value


def _tracking_environment(source: str) -> jinja2.Template:
    """The template compiled in a private environment whose filters and `is string` test
    record what they are applied to (tojson and string read their input deeply)."""
    env = hf_environment()
    for name, func in list(env.filters.items()):
        env.filters[name] = _recording_filter(name, func)
    env.tests["string"] = _recording_string_test(env.tests["string"])
    return compile_in(env, source)


def _recording_filter(name: str, func):
    deep = name in ("tojson", "string")

    def recorded(*args, **kwargs):
        # Filters that take the environment or context get it first; the value comes next.
        values = [a for a in args[:2] if _tracked(a)]
        for value in values[:1]:
            _mark(value, name, deep=deep)
        if deep:  # serialising must not count as indexing or iterating
            args = tuple(_untrack(a) for a in args)
        return func(*args, **kwargs)

    for attr in ("jinja_pass_arg",):  # keep @pass_environment / @pass_context markers
        if hasattr(func, attr):
            setattr(recorded, attr, getattr(func, attr))
    return recorded


def _recording_string_test(func):
    def recorded(value):
        _mark(value, "test_is_string")
        return func(value)

    return recorded


def _run(template: jinja2.Template, messages: list, tools: list | None = None,
         extra: dict | None = None) -> tuple[bool, str, Any, Any]:
    """caps_try_execute: render the probe; exceptions count as failure, stats are kept."""
    tracked_messages, tracked_tools = _track(messages), _track(tools or [])
    context = {"messages": tracked_messages, "tools": tracked_tools, "bos_token": "",
               "eos_token": "", "add_generation_prompt": True, **(extra or {})}
    try:
        return True, template.render(context), tracked_messages, tracked_tools
    except Exception:  # noqa: BLE001 - any failure of the probe is an answer, as in caps.cpp
        return False, "", tracked_messages, tracked_tools


def _ops(value: Any) -> set[str]:
    return value._caps_stats.ops if _tracked(value) else set()


def _used(value: Any) -> bool:
    return _tracked(value) and value._caps_stats.used


def _at(value: Any, *path: str | int) -> Any:
    """value[path...] read without recording a use."""
    for key in path:
        value = (dict.__getitem__ if isinstance(value, dict) else list.__getitem__)(value, key)
    return value


STRING_MARKER = "STRING_MARKER"
REASONING_PLACEHOLDER = "<REASONING_CONTENT_PLACEHOLDER>"
_TOOLS = [{"name": "tool", "type": "function", "function": {
    "name": "tool1", "description": "Tool description", "parameters": {
        "type": "object",
        "properties": {"arg": {"type": "string", "description": "Arg description"}},
        "required": ["arg"]}}}]


def _tool_conversation(arguments: Any, n_calls: int = 1) -> list[dict]:
    calls = [{"id": f"call0000{i + 1}", "type": "function",
              "function": {"name": "tool1", "arguments": arguments}} for i in range(n_calls)]
    return [
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
        {"role": "assistant", "content": "The tool response was 'tool response'"},
        {"role": "user", "content": "User message"},
    ]


def _content_caps(template: jinja2.Template) -> dict[str, bool]:
    found: dict[str, bool] = {}
    ok, out, messages, _ = _run(template, [{"role": "user", "content": STRING_MARKER}])
    ops = _ops(_at(messages, 0, "content"))
    as_array = bool(ops & {"selectattr", "array_access"})
    if as_array:
        found["supports_typed_content"] = True
    if not ok or (as_array and STRING_MARKER not in out):
        found["supports_string_content"] = False
    if "test_is_string" in ops:
        ok, _, messages, _ = _run(template, [{"role": "user", "content": []}])
        if ok and _ops(_at(messages, 0, "content")) & {"selectattr", "array_access"}:
            found["supports_typed_content"] = True
    return found


def _system_caps(template: jinja2.Template) -> dict[str, bool]:
    _, _, messages, _ = _run(template, [{"role": "system", "content": "System message"},
                                        {"role": "user", "content": "User message"}])
    return {} if _used(_at(messages, 0, "content")) else {"supports_system_role": False}


def _tool_caps(template: jinja2.Template) -> dict[str, bool]:
    found: dict[str, bool] = {}
    ok, _, messages, tools = _run(template, _tool_conversation({"arg": "value"}), _TOOLS)
    if ok:
        _read_tool_use(messages, tools, found)
        if found.get("supports_tool_calls", True):
            if _used(_at(messages, 1, "tool_calls", 0, "function", "arguments", "arg")):
                found["supports_object_arguments"] = True
    if not found.get("supports_object_arguments"):
        ok, _, messages, tools = _run(template, _tool_conversation('{"arg": "value"}'), _TOOLS)
        if not ok:
            return {**found, "supports_tool_calls": False, "supports_tools": False}
        _read_tool_use(messages, tools, found)
    return found


def _read_tool_use(messages, tools, found: dict[str, bool]) -> None:
    if not _used(_at(tools, 0, "function", "name")):
        found["supports_tools"] = False
    if not _used(_at(messages, 1, "tool_calls")):
        found["supports_tool_calls"] = False


def _parallel_caps(template: jinja2.Template, object_arguments: bool) -> dict[str, bool]:
    arguments = {"arg": "value"} if object_arguments else '{"arg": "value"}'
    ok, _, messages, _ = _run(template, _tool_conversation(arguments, n_calls=2), _TOOLS)
    if not ok:
        return {"supports_parallel_tool_calls": False}
    second = _at(messages, 1, "tool_calls", 1, "function")
    return {} if _used(second) else {"supports_parallel_tool_calls": False}


def _reasoning_caps(template: jinja2.Template, source: str) -> dict[str, bool]:
    history = [
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "Assistant message",
         "reasoning_content": REASONING_PLACEHOLDER},
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "Assistant message",
         "reasoning_content": "Reasoning content"},
        {"role": "user", "content": "User message"},
    ]
    extra = {"enable_thinking": True, **preserve_reasoning_context(True)}
    _, out, _, _ = _run(template, history, extra=extra)
    found = {"supports_preserve_reasoning": REASONING_PLACEHOLDER in out}
    # caps.cpp asks whether the variable was read during a render; jinja2 resolves every
    # name a template mentions up front, so the static question is the same one here.
    parsed = compile_template(source).environment.parse(source)
    names = meta.find_undeclared_variables(parsed)
    found["supports_reasoning_effort"] = bool(names & set(reasoning_effort_context("")))
    return found


def preserve_reasoning_context(enabled: bool) -> dict[str, bool]:
    """caps_apply_preserve_reasoning: the names templates use for keeping old reasoning."""
    return {"preserve_thinking": enabled, "clear_thinking": not enabled,
            "truncate_history_thinking": not enabled, "drop_thinking": not enabled}


def reasoning_effort_context(effort: str) -> dict[str, str]:
    """caps_apply_reasoning_effort: the names templates read a reasoning effort from."""
    return {"reasoning_effort": effort, "reasoning_strength": effort}


@lru_cache(maxsize=16)
def detect_caps(source: str) -> TemplateCaps:
    """jinja::caps_get for one template source (cached)."""
    try:
        template = _tracking_environment(source)
    except (EdgeInferError, jinja2.TemplateError):
        return TemplateCaps()
    found = _content_caps(template)
    found.update(_system_caps(template))
    found.update(_tool_caps(template))
    found.update(_parallel_caps(template, found.get("supports_object_arguments", False)))
    found.update(_reasoning_caps(template, source))
    return TemplateCaps(**found)
