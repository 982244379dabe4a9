"""Rendering a GGUF `tokenizer.chat_template` into a prompt string.

The Jinja environment matches Hugging Face transformers' `apply_chat_template` (sandboxed,
trim_blocks/lstrip_blocks, `raise_exception`, `strftime_now`, a `tojson` that does not
escape non-ASCII, the loopcontrols extension), which is what the templates are written for.
llama.cpp's common/chat.cpp behaviour is followed on top: ChatML when the model has no
template, and one leading BOS string removed when the tokenizer will add BOS itself.
"""

from __future__ import annotations

import copy
import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment

from edgeinfer.errors import EdgeInferError

# llama.cpp's fallback for models without a template (CHATML_TEMPLATE_SRC in common/chat.cpp).
CHATML_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}"
)


class TemplateRaised(jinja2.TemplateError):
    """Raised by a template's own `raise_exception(message)` call."""


def _raise_exception(message: str) -> None:
    raise TemplateRaised(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # HF's filter: plain json.dumps, no HTML escaping, non-ASCII kept as is. Lazy sequences
    # (jinja2's map and select return generators) are lists, as they are in llama.cpp.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
        sort_keys=sort_keys, default=_json_default,
    )


def _json_default(value: Any) -> Any:
    if isinstance(value, jinja2.Undefined):
        return None
    if hasattr(value, "__iter__") and not isinstance(value, (str, bytes, dict)):
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


class _LenientUndefined(jinja2.ChainableUndefined):
    """llama.cpp's undefined: reading a field of it gives undefined again (runtime.cpp's
    member expression), and `+` with a string treats it as "" (see _LlamaEnvironment)."""

    def __add__(self, other):
        return other if isinstance(other, str) else super().__add__(other)

    def __radd__(self, other):
        return other if isinstance(other, str) else super().__radd__(other)


class _LlamaEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox with `+` following llama.cpp's jinja runtime (common/jinja/runtime.cpp,
    binary_expression): a string plus none or undefined is the string
    (workaround_concat_null_with_str), and a string plus a number or a bool concatenates
    its text, where Python would raise."""

    intercepted_binops = frozenset({"+"})

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        # llama.cpp's runtime has list append and pop (value.cpp); templates such as
        # Kimi-K2's build lists with them. Other mutations stay refused.
        if isinstance(obj, list) and attr in ("append", "pop"):
            return SandboxedEnvironment.is_safe_attribute(self, obj, attr, value)
        return super().is_safe_attribute(obj, attr, value)

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        # Fail at once: a chainable undefined would otherwise render an unsafe access as "".
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} "
                            "object is unsafe.")

    def call_binop(self, context, operator, left, right):
        if operator == "+" and (isinstance(left, str) or isinstance(right, str)):
            return _concat_text(left) + _concat_text(right)
        return super().call_binop(context, operator, left, right)


def _concat_text(value: Any) -> str:
    if value is None or isinstance(value, jinja2.Undefined):
        return ""
    if isinstance(value, (str, int, float)):  # bool is an int: str(True) == "True" as in C++
        return value if isinstance(value, str) else str(value)
    raise TypeError(f"cannot concatenate a string and {type(value).__name__}")


class _GenerationBlocks(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask markers): the
    body renders as is, as llama.cpp's parser ignores both tags."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def hf_environment() -> ImmutableSandboxedEnvironment:
    """A fresh environment configured as transformers' apply_chat_template configures it,
    with llama.cpp's leniency about undefined values and string concatenation."""
    env = _LlamaEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationBlocks], undefined=_LenientUndefined,
    )
    env.filters["tojson"] = _tojson
    # Markup would HTML-escape what is concatenated to it; llama.cpp's `safe` does nothing.
    env.filters["safe"] = str
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@lru_cache(maxsize=16)
def compile_template(template: str) -> jinja2.Template:
    """Compile a chat template once (cached by its source)."""
    return compile_in(hf_environment(), template)


def compile_in(env: jinja2.Environment, template: str) -> jinja2.Template:
    """Compile `template` in `env`; a syntax error becomes a one-line EdgeInferError."""
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise EdgeInferError(f"chat template does not parse: {_one_line(exc)}") from exc


def render_chat(
    template: str | None,
    messages: list[dict],
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    tools: list[dict] | None = None,
    strip_bos: bool = False,
    **extra: Any,
) -> str:
    """Render `messages` with a chat template; None or "" uses ChatML.

    `strip_bos`: the tokenizer adds BOS itself, so drop one leading `bos_token` from the
    result (as llama.cpp does) to avoid a doubled BOS. `extra` is passed to the template
    (e.g. `enable_thinking`). A template error, including the template's own
    `raise_exception`, becomes an EdgeInferError with a one-line message.
    """
    context = dict(messages=messages, add_generation_prompt=add_generation_prompt,
                   bos_token=bos_token, eos_token=eos_token, tools=tools, **extra)
    prompt = render_template(template or CHATML_TEMPLATE, context)
    if strip_bos and bos_token and prompt.startswith(bos_token):
        prompt = prompt[len(bos_token) :]
    return prompt


def render_template(template: str, context: dict[str, Any]) -> str:
    """Render `template` with exactly the variables in `context` (a variable left out is
    undefined, which templates can test with `is defined`). Errors, including the
    template's own `raise_exception`, become one-line EdgeInferErrors."""
    compiled = compile_template(template)
    try:  # a copy: templates may append to lists, never to the caller's
        return compiled.render(copy.deepcopy(context))
    except TemplateRaised as exc:
        raise EdgeInferError(f"chat template rejected the messages: {_one_line(exc)}") from exc
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError,
            AttributeError, RecursionError) as exc:
        # RecursionError: Hermes' json_to_python_type recurses forever on a "null" type
        raise EdgeInferError(f"chat template failed: {_one_line(exc)}") from exc


def _one_line(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__
