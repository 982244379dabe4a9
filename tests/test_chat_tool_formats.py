"""Tool-call formats, grammars and requests for the templates edgeinfer's users run: Qwen 2.5
and 3, Hermes 2 Pro and 3, Llama 3.1 and 3.3, Mistral Nemo, and a template without tools.

Expectations come from llama.cpp's tests: the analysis values of
tests/test-chat-auto-parser.cpp (its test functions are named in comments), its
standard_json_tools, normalize_quotes_to_json and tagged-argument cases, and the model
outputs of tests/test-chat.cpp (`HERMES_CALL`, `NEMO_CALL`, ...). A Llama 3.x call is the
JSON its template asks for ("Respond in the format {"name": function name, "parameters":
...}"), and its llama.cpp tests only check that content stays content.
"""

from __future__ import annotations

import json

import pytest
from test_chat_refs import peg_tools, template_source, templates_dir
from test_chat_tools import grammar_error

from edgeinfer.chat import (
    ChatMsg,
    ChatParser,
    ChatRequestError,
    ChatTool,
    GrammarTrigger,
    ToolCall,
    chat_prompt,
    chat_settings,
    init_templates,
    peg,
    prepare_chat,
)
from edgeinfer.chat.analysis import analyze_template
from edgeinfer.chat.mapper import message_from_tree, normalize_quotes_to_json
from edgeinfer.chat.parser import FORMAT_PEG, ChatSyntax
from edgeinfer.chat.prompt import ChatInputs
from edgeinfer.chat.render import ChatTemplate
from edgeinfer.chat.tool_analysis import JSON_NATIVE, TAG_WITH_TAGGED
from edgeinfer.chat.tool_parser import standard_json_tools, tag_with_tagged
from edgeinfer.errors import EdgeInferError

llguidance = pytest.importorskip("llguidance")

SPECIAL = ChatTool("special_function", "I'm special", {
    "type": "object", "properties": {"arg1": {"type": "integer", "description": "The arg."}},
    "required": ["arg1"]})
SPECIAL_OPT = ChatTool("special_function_with_opt", "I'm special but have optional stuff", {
    "type": "object", "properties": {"arg1": {"type": "integer"}, "arg2": {"type": "integer"}},
    "required": ["arg1"]})
USER = ChatMsg(role="user", content="Hey there!")
CALL = ToolCall("special_function", '{"arg1": 1}')

# Model outputs, from test-chat.cpp (Hermes 2 Pro, Hermes 3 / Qwen 2.5 loop, Mistral Nemo)
HERMES_CALL = '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}</tool_call>'
QWEN_CALL = '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>'
NEMO_CALL = ('[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, '
             '"id": "123456789"}]')
LLAMA_CALL = '{"name": "special_function", "parameters": {"arg1": 1}}'

TARGETS = [  # template, a call as the model writes it, its trigger word (None: no lazy grammar)
    ("Qwen-Qwen2.5-7B-Instruct", QWEN_CALL, "<tool_call>\n"),
    ("Qwen-Qwen3-0.6B", QWEN_CALL, "<tool_call>\n"),
    ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", QWEN_CALL, "<tool_call>\n"),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", QWEN_CALL, "<tool_call>\n"),
    ("meta-llama-Llama-3.1-8B-Instruct", LLAMA_CALL, None),
    ("meta-llama-Llama-3.3-70B-Instruct", LLAMA_CALL, None),
    ("mistralai-Mistral-Nemo-Instruct-2407", NEMO_CALL, "[TOOL_CALLS]"),
]


def _prompt(name: str, tool_choice: str = "auto", tools=(SPECIAL,), parallel: bool = False,
            special_tokens=None, **fields):
    templates = init_templates(template_source(name), special_tokens=special_tokens)
    inputs = ChatInputs(messages=[USER], tools=list(tools), tool_choice=tool_choice,
                        parallel_tool_calls=parallel, reasoning_format="auto", **fields)
    return prepare_chat(templates, inputs)


def _parse(prompt, text: str) -> ChatMsg:
    parser = ChatParser(prompt.syntax, tool_call_id=None)
    parser.finish(text)
    return parser.message


# -- the analysis (tests/test-chat-auto-parser.cpp) ---------------------------------------------
@pytest.mark.parametrize("name,expected", [
    # test_nemotron_tool_format
    ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", dict(
        mode=TAG_WITH_TAGGED, section_start="", section_end="", per_call_start="<tool_call>\n",
        per_call_end="</tool_call>", name_prefix="<function=", name_suffix=">\n",
        function_close="</function>\n", arg_name_prefix="<parameter=", arg_name_suffix=">\n",
        arg_value_suffix="\n</parameter>\n")),
    # test_laguna_tool_format, test_laguna_s_tool_format, test_laguna_xs2_tool_format
    ("poolside-Laguna-XS-2.1", dict(arg_value_suffix="</arg_value>")),
    ("poolside-Laguna-S-2.1", dict(arg_value_suffix="</arg_value>")),
    ("poolside-Laguna-XS.2", dict(arg_value_suffix="</arg_value>")),
    # test_tool_format_cohere
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", dict(
        mode=JSON_NATIVE, section_start="<|START_ACTION|>", section_end="<|END_ACTION|>",
        per_call_start="", per_call_end="", name_prefix="", name_suffix="", function_close="",
        args_start="", args_end="", arg_name_prefix="", arg_name_suffix="",
        arg_value_prefix="", arg_value_suffix="", arg_separator="", name_field="tool_name",
        args_field="parameters", id_field="", tools_array_wrapped=True)),
])
def test_tool_format_analysis(name, expected):
    tools = analyze_template(ChatTemplate(template_source(name))).tools
    assert {key: getattr(tools, key) for key in expected} == expected


BAILING_V3 = """
{# Bailing V3 chat template #}
{%- if tools %}{{ tools | tojson }}{%- endif %}
{%- for message in messages %}
    {%- if message.role == "user" %}
        {{- '<role>HUMAN</role>' + message.content + '<|role_end|>' }}
    {%- elif message.role == "assistant" %}
        {{- '<role>ASSISTANT</role>' }}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- set tc = tool_call.function %}
                {{- '<tool_call>' + tc.name }}
                {%- for k, v in tc.arguments.items() %}
                    {{- '<arg_key>' + k + '</arg_key>' }}
                    {{- '\\n<arg_value>' + v + '</arg_value>' }}
                {%- endfor %}
                {{- '\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|role_end|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<role>ASSISTANT</role>' }}{%- endif %}
"""


def test_bailing_v3_tool_format():
    """test_bailing_v3_tool_format: whitespace between the argument tags is tolerated."""
    found = analyze_template(ChatTemplate(BAILING_V3))
    assert found.tools.arg_value_suffix == "</arg_value>"
    assert found.tools.tolerate_intertag_whitespace
    tool = {"type": "function", "function": {"name": "test_function_name", "parameters": {
        "type": "object", "properties": {"param1": {"type": "string"},
                                         "param2": {"type": "string"}}}}}
    syntax = _syntax(found.tools, (tool,))
    output = ("<tool_call>test_function_name\n<arg_key>param1</arg_key>\n"
              "<arg_value>value1</arg_value><arg_key>param2</arg_key>\n"
              "<arg_value>value2</arg_value>\n</tool_call>")
    assert peg.parse(tag_with_tagged(syntax, peg.eps()), output, lenient=True).success


def _syntax(tool_format, tools, tool_choice="auto", parallel=False):
    return ChatSyntax(format=FORMAT_PEG, tool_format=tool_format, tools=tuple(tools),
                      tool_choice=tool_choice, parallel_tool_calls=parallel)


# -- standard_json_tools and the mapper (test-chat-auto-parser.cpp) -----------------------------
WEATHER = ({"type": "function", "function": {
    "name": "get_current_weather", "description": "Get the current weather in a given location",
    "parameters": {"type": "object", "properties": {
        "location": {"type": "string", "description": "The city and state"},
        "unit": {"type": "string", "description": "Temperature unit",
                 "enum": ["celsius", "fahrenheit"]}},
        "required": ["location"]}}},)


@pytest.mark.parametrize("marker,options,text,call_id", [
    # test_standard_json_tools_openai
    (("<tool_call>", "</tool_call>"),
     dict(name_key="function.name", args_key="function.arguments", call_id_key="id"),
     'Let me check the weather.<tool_call>{"id": "call_abc123", "function": {"name": '
     '"get_current_weather", "arguments": {"location": "NYC"}}}</tool_call>', "call_abc123"),
    # test_standard_json_tools_cohere
    (("<|START_ACTION|>[", "]<|END_ACTION|>"),
     dict(name_key="tool_name", args_key="parameters", gen_call_id_key="tool_call_id",
          parameters_order=("tool_call_id", "tool_name", "parameters")),
     'Let me search for that.<|START_ACTION|>[{"tool_call_id": 0, "tool_name": '
     '"get_current_weather", "parameters": {"location": "NYC", "unit": "celsius"}}]'
     '<|END_ACTION|>', "0"),
    # test_standard_json_tools_function_key
    (("<tool_calls>[", "]</tool_calls>"),
     dict(args_key="args", function_is_key=True, call_id_key="id"),
     'I\'ll call the weather function.<tool_calls>[{"get_current_weather": {"id": '
     '"call-0001", "args": {"location": "NYC", "unit": "celsius"}}}]</tool_calls>',
     "call-0001"),
])
def test_standard_json_tools(marker, options, text, call_id):
    calls = standard_json_tools(*marker, WEATHER, parallel=True, force=False, **options)
    parser = peg.tag("content", peg.until(marker[0].rstrip("["))) + calls + peg.end()
    result = peg.parse(parser, text, lenient=False)
    assert result.success
    message = message_from_tree(result)
    assert [(c.name, c.id) for c in message.tool_calls] == [("get_current_weather", call_id)]
    assert text.startswith(message.content) and message.content


@pytest.mark.parametrize("text,expected", [
    # test_normalize_quotes_to_json
    ("{'key': 'value'}", '{"key": "value"}'),
    ("{'code': 'print(\\'hello\\')'}", '{"code": "print(\'hello\')"}'),
    ("{'msg': 'He said \"hi\"'}", '{"msg": "He said \\"hi\\""}'),
    ("{'path': 'C:\\\\Users\\\\test'}", '{"path": "C:\\\\Users\\\\test"}'),
    ("{'text': 'line1\\nline2'}", '{"text": "line1\\nline2"}'),
    ('{"already_double": \'single_value\'}', '{"already_double": "single_value"}'),
    # test_normalize_quotes_with_embedded_quotes
    ("{'filename': 'foo.cpp', 'oldString': 'def foo(arg = \"14\"):\\n    return arg + "
     "\"bar\"\\n', 'newString': 'def foo(arg = \"15\"):\\n    pass\\n'}",
     '{"filename": "foo.cpp", "oldString": "def foo(arg = \\"14\\"):\\n    return arg + '
     '\\"bar\\"\\n", "newString": "def foo(arg = \\"15\\"):\\n    pass\\n"}'),
])
def test_normalize_quotes_to_json(text, expected):
    assert normalize_quotes_to_json(text) == expected
    json.loads(normalize_quotes_to_json(text))


def test_tagged_args_with_embedded_quotes():
    """test_tagged_args_with_embedded_quotes: string values are escaped into JSON."""
    def argument(name: str) -> peg.Parser:
        return peg.optional(peg.rule(f"arg-{name}", peg.tag("tool-arg",
            peg.atomic(peg.tag("tool-arg-open", "<parameter=" + peg.atomic(peg.tag(
                "tool-arg-name", name)) + ">")) + peg.space()
            + peg.tag("tool-arg-string-value", peg.until("</parameter>")) + peg.space()
            + peg.atomic(peg.tag("tool-arg-close", "</parameter>")))))
    args = argument("filename") + peg.space() + argument("oldString") + peg.space() \
        + argument("newString")
    function = peg.atomic(peg.tag("tool-open", "<function=" + peg.atomic(
        peg.tag("tool-name", "edit")) + ">")) + peg.space() + args + peg.space() \
        + peg.atomic(peg.tag("tool-close", "</function>"))
    parser = peg.tag("content", peg.until("<seed:tool_call>")) + peg.optional(
        "<seed:tool_call>" + peg.space() + function + peg.space() + "</seed:tool_call>") \
        + peg.end()
    text = ('<seed:tool_call>\n<function=edit>\n<parameter=filename>foo.cpp</parameter>\n'
            '<parameter=oldString>def foo(arg = "14"):\n    return arg + "bar"\n\n'
            '</parameter>\n<parameter=newString>def foo(arg = "15"):\n    pass\n\n'
            '</parameter>\n</function>\n</seed:tool_call>')
    result = peg.parse(parser, text, lenient=False)
    assert result.success
    (call,) = message_from_tree(result).tool_calls
    arguments = json.loads(call.arguments)
    assert (call.name, arguments["filename"]) == ("edit", "foo.cpp")
    assert '"14"' in arguments["oldString"] and '"bar"' in arguments["oldString"]
    assert '"15"' in arguments["newString"]


# -- the target templates -------------------------------------------------------------------------
@pytest.mark.parametrize("name,text,trigger", TARGETS)
def test_calls_parsed_and_lazy_grammar(name, text, trigger):
    """Under "auto" a call is parsed; the grammar starts at the call marker, and a template
    whose calls have no marker (Llama 3.x's bare JSON) gets none, as in llama.cpp."""
    prompt = _prompt(name)
    assert _parse(prompt, "Hello, world!\nWhat's up?") == ChatMsg(
        content="Hello, world!\nWhat's up?")
    (call,) = _parse(prompt, text).tool_calls
    assert (call.name, json.loads(call.arguments)) == ("special_function", {"arg1": 1})
    if trigger is None:
        assert (prompt.grammar, prompt.grammar_triggers) == ("", ())
        return
    assert prompt.grammar_lazy and prompt.grammar_triggers == (GrammarTrigger("word", trigger),)
    assert trigger.strip() in prompt.preserved_tokens
    assert grammar_error(prompt.grammar, text[text.index(trigger):]) == ""


@pytest.mark.parametrize("name,text,trigger", TARGETS)
def test_required_grammar(name, text, trigger):
    """Under "required" the grammar applies from the first token, after the generation
    prompt: a call first (llama.cpp allows text before it; here it does not: a small model
    would write until max_tokens and never call) and nothing else. Without
    parallel_tool_calls a second call is refused (llama.cpp lets a format that marks each
    call, `<tool_call>`, repeat the marked call anyway)."""
    prompt = _prompt(name, "required")
    assert prompt.grammar and not prompt.grammar_lazy and not prompt.grammar_triggers
    start = prompt.grammar_prefill
    assert start == prompt.generation_prompt
    assert grammar_error(prompt.grammar, start + text) == ""
    assert grammar_error(prompt.grammar, start + "Let me see." + text).startswith("rejected")
    assert grammar_error(prompt.grammar, start + "Hello").startswith("rejected")
    for wrong in (text.replace("special_function", "other_function"),
                  text.replace('"arg1": 1', '"arg1": "one"')):
        assert grammar_error(prompt.grammar, start + wrong).startswith("rejected")
    repeated = grammar_error(prompt.grammar, start + text + text)
    assert repeated.startswith("rejected")  # llama.cpp lets a marked call repeat


@pytest.mark.parametrize("name,text,trigger", [t for t in TARGETS if t[2] is not None])
def test_parallel_calls(name, text, trigger):
    prompt = _prompt(name, tools=(SPECIAL, SPECIAL_OPT), parallel=True)
    second = text.replace("special_function", "special_function_with_opt") \
        .replace('{"arg1": 1}', '{"arg1": 1, "arg2": 2}')
    if name.startswith("mistralai"):  # one [TOOL_CALLS] array holds them all
        both = text[:-1] + ", " + second[len("[TOOL_CALLS]["):]
    else:
        both = text + "\n" + second
    calls = _parse(prompt, both).tool_calls
    assert [c.name for c in calls] == ["special_function", "special_function_with_opt"]
    assert grammar_error(prompt.grammar, both[both.index(trigger):]) == ""


def test_template_without_tools():
    """A template that renders no tool calls (Gemma 2): this llama.cpp parses content and
    builds no grammar (its generic JSON format is gone); the tools reach the template."""
    prompt = _prompt("google-gemma-2-2b-it")
    assert (prompt.grammar, prompt.syntax.tools) == ("", ())
    assert _parse(prompt, QWEN_CALL) == ChatMsg(content=QWEN_CALL)


def test_dedicated_handler_templates_read_calls_as_content():
    """Templates llama.cpp parses with a dedicated handler (Qwen3-Coder's XML calls here)
    keep their calls as content and get no grammar: the generic format is not trusted."""
    prompt = _prompt("Qwen3-Coder")
    text = ("<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n"
            "</function>\n</tool_call>")
    assert prompt.specialized == "qwen3-coder" and prompt.grammar == ""
    assert "<function=" not in prompt.preserved_tokens
    assert _parse(prompt, text) == ChatMsg(content=text)


def test_tool_choice_none():
    """Tools are still rendered, but calls are neither parsed nor constrained."""
    prompt = _prompt("Qwen-Qwen2.5-7B-Instruct", "none")
    assert '"name": "special_function"' in prompt.prompt and prompt.grammar == ""
    assert _parse(prompt, QWEN_CALL) == ChatMsg(content=QWEN_CALL)


def test_named_tool_choice():
    """OpenAI's named tool_choice: every tool rendered, only the named one callable, from
    the first token."""
    templates = init_templates(template_source("Qwen-Qwen2.5-7B-Instruct"))
    tools = [tool.to_json() for tool in (SPECIAL, SPECIAL_OPT)]
    body = {"messages": [{"role": "user", "content": "Hey there!"}], "tools": tools,
            "tool_choice": {"type": "function", "function": {"name": "special_function"}}}
    prompt = chat_prompt(templates, body, chat_settings(templates))
    assert "special_function_with_opt" in prompt.prompt and not prompt.grammar_lazy
    other = QWEN_CALL.replace("special_function", "special_function_with_opt")
    assert grammar_error(prompt.grammar, prompt.generation_prompt + QWEN_CALL) == ""
    assert grammar_error(prompt.grammar, prompt.generation_prompt + other).startswith("rejected")
    body["tool_choice"]["function"]["name"] = "missing"
    with pytest.raises(ChatRequestError, match="not in tools"):
        chat_prompt(templates, body, chat_settings(templates))


def test_special_tokens_are_named_by_id():
    """A marker that is a special token is `<[id]>` in the grammar, so llguidance matches
    the token and not its text."""
    prompt = _prompt("mistralai-Mistral-Nemo-Instruct-2407", special_tokens={"[TOOL_CALLS]": 5})
    assert "<[5]>" in prompt.grammar and '"[TOOL_CALLS]"' not in prompt.grammar
    vocab = [bytes([i]) for i in range(256)] + [b"<eos>", b"[TOOL_CALLS]"]

    class Vocab:
        tokens, eos_token_id, bos_token_id, special_token_ids = vocab, 256, None, [256, 257]

        def __call__(self, text):
            return list(text.encode() if isinstance(text, str) else text)

    tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(Vocab()), slices=[])
    grammar = prompt.grammar.replace("<[5]>", "<[257]>")
    matcher = llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar),
                                   log_level=0)
    tokens = [257] + list(NEMO_CALL[len("[TOOL_CALLS]"):].encode())
    assert all(matcher.consume_token(t) for t in tokens) and matcher.is_accepting()


def test_streamed_call_diffs_add_up_with_stable_ids():
    """A call appears with its name and a generated id once, then its arguments grow; the
    diffs concatenated are the final message, and every call keeps its id."""
    prompt = _prompt("Qwen-Qwen2.5-7B-Instruct", tools=(SPECIAL, SPECIAL_OPT), parallel=True)
    text = "Let me check." + QWEN_CALL + "\n" + QWEN_CALL.replace('1}}', '2}}')
    parser = ChatParser(prompt.syntax)
    content, calls = "", {}
    for char in text[:-1]:
        for diff in parser.feed(char):
            content += diff.content_delta
            if diff.tool_call_index >= 0:
                delta = diff.tool_call_delta
                name, args, call_id = calls.get(diff.tool_call_index, ("", "", ""))
                if delta.name or delta.id:
                    assert not name and delta.name and len(delta.id) == 32  # once, complete
                calls[diff.tool_call_index] = (name or delta.name, args + delta.arguments,
                                               call_id or delta.id)
    for diff in parser.finish(text[-1]):
        assert diff.tool_call_index >= 0 and not diff.tool_call_delta.id
        name, args, call_id = calls[diff.tool_call_index]
        calls[diff.tool_call_index] = (name, args + diff.tool_call_delta.arguments, call_id)
    final = parser.message
    assert content == final.content == "Let me check."
    assert [calls[i] for i in range(2)] == [(c.name, c.arguments, c.id) for c in final.tool_calls]
    assert final.tool_calls[0].id != final.tool_calls[1].id


def test_model_given_id_kept_when_parsed_at_once():
    """llama-server keeps an id the model wrote (Mistral Nemo's) when the call is first seen
    complete, as in a non-streamed reply."""
    prompt = _prompt("mistralai-Mistral-Nemo-Instruct-2407")
    parser = ChatParser(prompt.syntax)
    parser.finish(NEMO_CALL)
    assert parser.message.tool_calls[0].id == "123456789"


@pytest.mark.parametrize("name,expected", [
    ("Qwen-Qwen2.5-7B-Instruct", "<|im_start|>user\n<tool_response>\nSunny\n</tool_response>"),
    ("Qwen-Qwen3-0.6B", "<|im_start|>user\n<tool_response>\nSunny\n</tool_response>"),
    ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
     "<|im_start|>tool\n<tool_response>\nSunny\n</tool_response>"),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
     "<|im_start|>tool\n<tool_response>\nSunny\n</tool_response>"),
    ("meta-llama-Llama-3.1-8B-Instruct", '<|start_header_id|>ipython<|end_header_id|>\n\n"Sunny"'),
    ("meta-llama-Llama-3.3-70B-Instruct", '<|start_header_id|>ipython<|end_header_id|>\n\n"Sunny"'),
    ("mistralai-Mistral-Nemo-Instruct-2407",
     '[TOOL_RESULTS]{"content": Sunny, "call_id": "123456789"}[/TOOL_RESULTS]'),
])
def test_next_turn_renders_the_call_and_its_result(name, expected):
    """The assistant's call renders back as the model wrote it (llama.cpp's reconstruction
    check) and the tool's result as the template writes tool messages."""
    text = dict((t[0], t[1]) for t in TARGETS)[name]
    first = _prompt(name)
    call = _parse(first, text).tool_calls[0]
    messages = [USER, ChatMsg(tool_calls=(ToolCall(call.name, call.arguments, "123456789"),)),
                ChatMsg(role="tool", content="Sunny", tool_name="special_function",
                        tool_call_id="123456789")]
    templates = init_templates(template_source(name))
    prompt = prepare_chat(templates, ChatInputs(messages=messages, tools=[SPECIAL])).prompt
    if not name.startswith("mistralai"):  # its template writes the id the call got
        assert prompt.startswith(first.prompt + text)
    assert expected in prompt and prompt.index(text.strip()) < prompt.index(expected)


# -- the JSON scanner against llama.cpp's JSON grammar ----------------------------------------
def _combinator_json() -> peg.Parser:
    """common_peg_parser_builder::json() written with the PEG primitives (the reference the
    scanner must agree with)."""
    value = peg.choice()  # filled below: a recursive grammar
    member = peg.seq(peg.json_string(), peg.space(), ":", peg.space(), value)
    members = peg.seq(member, peg.zero_or_more(peg.seq(peg.space(), ",", peg.space(), member)))
    obj = peg.seq("{", peg.space(), peg.choice("}", peg.seq(members, peg.space(), "}")))
    elements = peg.seq(value, peg.zero_or_more(peg.seq(peg.space(), ",", peg.space(), value)))
    array = peg.seq("[", peg.space(), peg.choice("]", peg.seq(elements, peg.space(), "]")))
    value.children[:] = [obj, array, peg.json_string(), peg.json_number(),
                         peg.choice("true", "false"), peg.literal("null")]
    return value


JSON_SAMPLES = [
    '{"arg1": 1}', '{ "a" : [1, -2.5e+3, 0, true, false, null, "x\\"y\\u00e9\\n"] }',
    '[]', '{}', '[{"a": {"b": [[]]}}, "s"]', '-0.0E-1', '01', '1.', '1e', '{"a" 1}',
    '{"a": 1,}', '[1 2]', 'nul', 'tx', '"\\x"', '{"a": "\\u12G4"}', '  {"k":"v"}  x',
]


@pytest.mark.parametrize("lenient", [True, False])
def test_json_scanner_matches_the_combinators(lenient):
    reference, scanner = _combinator_json(), peg.json_value()
    for sample in JSON_SAMPLES:
        for cut in range(len(sample) + 1):
            text = sample[:cut]
            want = peg.parse(reference, text, lenient=lenient)
            got = peg.parse(scanner, text, lenient=lenient)
            assert got.status == want.status, text
            if not want.fail:
                assert got.end == want.end, text


# -- every grammar compiles -----------------------------------------------------------------------
def _template_names():
    folder = templates_dir()
    return sorted(p.stem for p in folder.glob("*.jinja")) if folder else ["absent"]


@pytest.mark.parametrize("name", _template_names())
def test_grammars_compile(name):
    """llguidance compiles the grammar of every template with test-chat.cpp's tools (nested,
    nullable, union and empty schemas, dotted names), under auto and required, with and
    without parallel calls."""
    tools = [ChatTool(t["function"]["name"], t["function"]["description"],
                      t["function"]["parameters"]) for t in peg_tools().values()]
    templates = init_templates(template_source(name))
    for choice in ("auto", "required"):
        for parallel in (False, True):
            inputs = ChatInputs(messages=[USER], tools=tools, tool_choice=choice,
                                parallel_tool_calls=parallel, reasoning_format="auto")
            try:
                prompt = prepare_chat(templates, inputs)
            except EdgeInferError:  # a template that cannot render some schema (Hermes)
                inputs.tools = [SPECIAL, SPECIAL_OPT]
                prompt = prepare_chat(templates, inputs)
            if prompt.grammar:
                assert grammar_error(prompt.grammar) == "", prompt.grammar


@pytest.mark.parametrize("text,start,expected", [
    ("hello <tool_call>\n{", False, 6),
    ("no call here", False, None),
    ("<think>maybe <tool_call>\n</think> <tool_call>\n", False, 34),
    ("still thinking <tool_call>\n</think>then <tool_call>\nx", True, 40),
    ("thinking <tool_call>\n with no end", True, None),
    ("<think>a</think><think>b <tool_call>\n</think>", False, None),
])
def test_lazy_grammar_starts_at_the_first_trigger_outside_reasoning(text, start, expected):
    from edgeinfer.chat.grammar import LazyStart

    lazy = LazyStart(("<tool_call>\n",), "<think>", ("</think>",), start)
    assert lazy.find(text) == expected
    if expected is not None:
        assert text[expected:].startswith("<tool_call>\n")
