"""Rendering a GGUF `tokenizer.chat_template` into a prompt string.

The Jinja environment matches Hugging Face transformers' `apply_chat_template` (sandboxed,
trim_blocks/lstrip_blocks, `raise_exception`, `strftime_now`, a `tojson` that does not
escape non-ASCII, the loopcontrols extension), which is what the templates are written for.
llama.cpp's common/chat.cpp behaviour is followed on top: ChatML when the model has no
template, and one leading BOS string removed when the tokenizer will add BOS itself.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

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
    # HF's filter: plain json.dumps, no HTML escaping, non-ASCII kept as is.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@lru_cache(maxsize=16)
def compile_template(template: str) -> jinja2.Template:
    """Compile a chat template once (cached by its source)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
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
    compiled = compile_template(template or CHATML_TEMPLATE)
    try:
        prompt = compiled.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            tools=tools,
            **extra,
        )
    except TemplateRaised as exc:
        raise EdgeInferError(f"chat template rejected the messages: {_one_line(exc)}") from exc
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError) as exc:
        raise EdgeInferError(f"chat template failed: {_one_line(exc)}") from exc
    if strip_bos and bos_token and prompt.startswith(bos_token):
        prompt = prompt[len(bos_token) :]
    return prompt


def _one_line(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__
