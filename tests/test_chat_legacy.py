"""The --no-jinja formats (edgeinfer/chat/legacy.py) against llama.cpp's expected outputs:
tests/test-chat-template.cpp's automated cases (each template is recognised from its source,
then formats the conversation) and the llama-server suite's --no-jinja tests."""

from __future__ import annotations

import pytest
from test_chat_refs import builtin_template_names, template_cases

from edgeinfer.chat import ChatRequestError, chat_prompt, init_templates
from edgeinfer.chat.legacy import BUILTIN_TEMPLATES, FORMATS, detect_template, format_chat
from edgeinfer.chat.request import ChatSettings

NO_JINJA = ChatSettings(use_jinja=False)


def _case_ids():
    try:
        return [case.name for case in template_cases()[1]]
    except BaseException:  # noqa: BLE001 - absent data: the test itself skips
        return ["absent"]


@pytest.mark.parametrize("name", _case_ids())
def test_template_case_formats_as_llama_cpp(name):
    """main_automated_tests' first loop: llama_chat_apply_template(template_str, ...)."""
    conversation, cases = template_cases()
    case = next(c for c in cases if c.name == name)
    detected = detect_template(case.template)
    assert detected is not None, f"{name}: not recognised"
    chat = conversation + case.extra_conversation
    assert format_chat(detected, chat, add_ass=True) == case.expected


def test_unknown_template_is_refused():
    assert detect_template("INVALID TEMPLATE") is None
    templates = init_templates("INVALID TEMPLATE")
    with pytest.raises(Exception, match="this custom template is not supported, try using "
                                        "--jinja"):
        chat_prompt(templates, {"messages": [{"role": "user", "content": "x"}]}, NO_JINJA)


def test_builtin_names_are_llama_cpps():
    assert list(BUILTIN_TEMPLATES) == sorted(builtin_template_names())


@pytest.mark.parametrize("name", BUILTIN_TEMPLATES)
def test_builtin_name_selects_its_format(name):
    assert detect_template(name) == name
    chat = [("system", "S"), ("user", "U"), ("assistant", "A"), ("user", "V")]
    text = format_chat(name, chat, add_ass=True)
    assert "U" in text and "V" in text


def test_format_table_has_a_format_for_every_detection():
    from edgeinfer.chat.legacy import DETECTION_RULES
    assert {name for _, name in DETECTION_RULES} <= set(FORMATS)


# -- llama-server's tests (tools/server/tests/unit/test_chat_completion.py) --------------------
BOOK = [{"role": "system", "content": "Book"},
        {"role": "user", "content": "What is the best book"}]


def test_suite_chat_template_llama3():
    """test_chat_template: --chat-template llama3 (the suite runs --no-jinja). The suite's
    expected prompt starts with "<s> ", the BOS token and the space the tokenizer adds when
    the prompt is tokenized; the template's text is the rest."""
    expected = ("<s> <|start_header_id|>system<|end_header_id|>\n\nBook<|eot_id|>"
                "<|start_header_id|>user<|end_header_id|>\n\nWhat is the best book<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n")
    result = chat_prompt(init_templates("llama3"), {"messages": BOOK}, NO_JINJA)
    assert result.prompt == expected[len("<s> "):]
    assert result.syntax.format == "content-only"  # no reasoning parsing without Jinja


def test_suite_apply_template_command_r():
    """test_apply_chat_template: --chat-template command-r, /apply-template."""
    body = {"messages": [{"role": "system", "content": "You are a test."},
                         {"role": "user", "content": "Hi there"}]}
    result = chat_prompt(init_templates("command-r"), body, NO_JINJA)
    assert result.prompt == (
        "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|>"
        "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>"
        "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")


def test_suite_continue_final_message_excludes_add_generation_prompt():
    """test_chat_template_continue_final_message_mutual_exclusion: 400."""
    body = {"add_generation_prompt": True, "continue_final_message": True,
            "messages": [{"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "Hello"}]}
    with pytest.raises(ChatRequestError, match="Cannot set both add_generation_prompt and "
                                               "continue_final_message to true."):
        chat_prompt(init_templates("llama3"), body, NO_JINJA)


def test_two_trailing_assistant_messages_are_refused():
    body = {"messages": [{"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "A"},
                         {"role": "assistant", "content": "B"}]}
    with pytest.raises(ChatRequestError, match="Cannot have 2 or more assistant messages at "
                                               "the end of the list."):
        chat_prompt(init_templates("llama3"), body, NO_JINJA)


def test_tools_need_jinja():
    body = {"messages": BOOK, "tools": [{"type": "function", "function": {"name": "f"}}]}
    with pytest.raises(ChatRequestError, match="tools param requires --jinja flag"):
        chat_prompt(init_templates("llama3"), body, NO_JINJA)
    with pytest.raises(ChatRequestError, match="tool_choice param requires --jinja flag"):
        chat_prompt(init_templates("llama3"), {"messages": BOOK, "tool_choice": "none"},
                    NO_JINJA)


def test_content_parts_are_joined_with_newlines():
    """common_chat_templates_apply_legacy joins text parts with "\\n"."""
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is"},
                                                      {"type": "text", "text": "the best"}]}]}
    result = chat_prompt(init_templates("chatml"), body, NO_JINJA)
    assert result.prompt == ("<|im_start|>user\nWhat is\nthe best<|im_end|>\n"
                             "<|im_start|>assistant\n")


def test_no_template_is_chatml():
    """A model without a template gets ChatML, which --no-jinja recognises as chatml."""
    templates = init_templates("", model_template=None)
    result = chat_prompt(templates, {"messages": BOOK}, NO_JINJA)
    assert result.prompt == ("<|im_start|>system\nBook<|im_end|>\n<|im_start|>user\nWhat is the "
                             "best book<|im_end|>\n<|im_start|>assistant\n")
