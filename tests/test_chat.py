"""Chat template rendering: ChatML fallback, real templates, sandboxing, BOS handling."""

from __future__ import annotations

from datetime import datetime

import pytest

from edgeinfer.chat import CHATML_TEMPLATE, render_chat
from edgeinfer.errors import EdgeInferError

# The real template from SmolLM2-135M-Instruct's GGUF, split only to fit 100 columns.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Gemma 1/2's template (tokenizer_config.json), which refuses system messages.
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)

SYSTEM_USER = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hello!"},
]


def test_chatml_system_user():
    expected = (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nHello!<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert render_chat(CHATML_TEMPLATE, SYSTEM_USER) == expected


def test_no_template_falls_back_to_chatml():
    assert render_chat(None, SYSTEM_USER) == render_chat(CHATML_TEMPLATE, SYSTEM_USER)
    assert render_chat("", SYSTEM_USER) == render_chat(CHATML_TEMPLATE, SYSTEM_USER)


def test_chatml_without_generation_prompt():
    prompt = render_chat(None, SYSTEM_USER, add_generation_prompt=False)
    assert prompt.endswith("Hello!<|im_end|>\n")


def test_smollm2_template_adds_default_system():
    prompt = render_chat(SMOLLM2_TEMPLATE, [{"role": "user", "content": "Hi"}])
    assert prompt == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_smollm2_template_keeps_given_system():
    assert render_chat(SMOLLM2_TEMPLATE, SYSTEM_USER) == render_chat(None, SYSTEM_USER)


def test_gemma_template_renders_turns():
    messages = [
        {"role": "user", "content": "Hi "},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
    ]
    prompt = render_chat(GEMMA_TEMPLATE, messages, bos_token="<bos>")
    assert prompt == (
        "<bos><start_of_turn>user\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


def test_raise_exception_becomes_one_line_error():
    with pytest.raises(EdgeInferError, match="System role not supported") as info:
        render_chat(GEMMA_TEMPLATE, SYSTEM_USER, bos_token="<bos>")
    assert "\n" not in str(info.value)
    with pytest.raises(EdgeInferError, match="must alternate"):
        render_chat(GEMMA_TEMPLATE, [{"role": "assistant", "content": "x"}])


def test_bos_stripping():
    prompt = render_chat(GEMMA_TEMPLATE, [{"role": "user", "content": "Hi"}], bos_token="<bos>")
    stripped = render_chat(
        GEMMA_TEMPLATE, [{"role": "user", "content": "Hi"}], bos_token="<bos>", strip_bos=True
    )
    assert prompt.startswith("<bos><start_of_turn>")
    assert stripped == prompt[len("<bos>") :]
    # Only one BOS is removed, and only at the very start.
    doubled = render_chat("{{ bos_token }}{{ bos_token }}x", [], bos_token="<s>", strip_bos=True)
    assert doubled == "<s>x"
    assert render_chat("x{{ bos_token }}", [], bos_token="<s>", strip_bos=True) == "x<s>"


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.__class__.__init__.__globals__ }}",
        "{% set _ = messages[0].update({'role': 'user'}) %}",
    ],
)
def test_sandbox_blocks_unsafe_access(template):
    messages = [{"role": "user", "content": "Hi"}]
    with pytest.raises(EdgeInferError, match="unsafe"):
        render_chat(template, messages)
    assert messages == [{"role": "user", "content": "Hi"}]


def test_list_append_works_on_a_copy():
    # llama.cpp's jinja runtime has list append (common/jinja/value.cpp); Kimi-K2's template
    # needs it. The caller's messages are never changed.
    messages = [{"role": "user", "content": "Hi"}]
    template = "{% set _ = messages.append({'role': 'user'}) %}{{ messages|length }}"
    assert render_chat(template, messages) == "2"
    assert messages == [{"role": "user", "content": "Hi"}]


def test_tojson_has_hf_semantics():
    tools = [{"name": "météo", "description": "<weather>"}]
    assert render_chat("{{ tools | tojson }}", [], tools=tools) == (
        '[{"name": "météo", "description": "<weather>"}]'
    )
    assert render_chat("{{ tools[0] | tojson(indent=2) }}", [], tools=tools) == (
        '{\n  "name": "météo",\n  "description": "<weather>"\n}'
    )


def test_helpers_and_extras():
    template = (
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{{ m.content }}{% endfor %}|{{ strftime_now('%Y') }}|{{ enable_thinking }}"
        "|{{ eos_token }}"
    )
    messages = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    prompt = render_chat(template, messages, eos_token="</s>", enable_thinking=False)
    assert prompt == f"a|{datetime.now().year}|False|</s>"


def test_syntax_error_is_edgeinfer_error():
    with pytest.raises(EdgeInferError, match="does not parse"):
        render_chat("{% for message in %}", SYSTEM_USER)


def test_runtime_type_error_is_edgeinfer_error():
    with pytest.raises(EdgeInferError, match="chat template failed"):
        render_chat("{{ messages[0].content + [] }}", [{"role": "user", "content": "x"}])


def test_endless_recursion_is_edgeinfer_error():
    """A macro that never stops (Hermes' json_to_python_type on a "null" type iterates the
    string's characters) is a template failure, not a crash."""
    template = "{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}"
    with pytest.raises(EdgeInferError, match="chat template failed"):
        render_chat(template, [{"role": "user", "content": "x"}])


def test_string_plus_null_or_undefined_is_the_string():
    # llama.cpp's jinja runtime (common/jinja/runtime.cpp, workaround_concat_null_with_str)
    # concatenates none and undefined as "", and numbers as their text.
    assert render_chat(None, [{"role": "user", "content": None}]) == (
        "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n")
    assert render_chat("{{ 'a' + nothing + 'b' + 1 + nothing.deeper }}", []) == "ab1"
