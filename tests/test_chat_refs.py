"""llama.cpp's own test data for the chat tests, read from the files
scripts/fetch_vocab_tests.py copies out of the llama-cpp-python 0.3.36 sdist: the real chat
templates (`templates/`) and the C++ tests whose expected values the chat tests reuse
(`llama-refs/`). The unpacked sdist under `llama-sdist/` is used when it is there instead.

The C++ is read, not compiled: a small lexer turns string literals (with escapes, adjacent
literals joined, raw strings), identifiers, numbers and punctuation into tokens, and a
reader turns brace initializers into Python values. The tests in this file check the
readers themselves on the parts of the files the other tests rely on.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import pytest

SDIST = "llama-sdist/llama_cpp_python-0.3.36/vendor/llama.cpp"


def _cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgeinfer"


def templates_dir() -> Path | None:
    for path in (_cache() / "templates", _cache() / SDIST / "models" / "templates"):
        if path.is_dir() and any(path.glob("*.jinja")):
            return path
    return None


def ref_file(name: str, sdist_path: str) -> Path | None:
    for path in (_cache() / "llama-refs" / name, _cache() / SDIST / sdist_path):
        if path.is_file():
            return path
    return None


def template_source(name: str) -> str:
    """The text of models/templates/<name>.jinja; skips the test when it is absent."""
    folder = templates_dir()
    if folder is None or not (folder / f"{name}.jinja").is_file():
        pytest.skip("llama.cpp's chat templates absent (run scripts/fetch_vocab_tests.py)")
    return (folder / f"{name}.jinja").read_text(encoding="utf-8")


def ref_text(name: str, sdist_path: str) -> str:
    path = ref_file(name, sdist_path)
    if path is None:
        pytest.skip(f"llama.cpp's {name} absent (run scripts/fetch_vocab_tests.py)")
    return path.read_text(encoding="utf-8")


# -- a C++ lexer ------------------------------------------------------------------------------
_TOKEN = re.compile(r'''
    (?P<space>\s+|//[^\n]*|/\*.*?\*/)
  | (?P<raw>(?:u8)?R"(?P<delim>[^(\s]*)\((?P<body>.*?)\)(?P=delim)")
  | (?P<string>(?:u8)?"(?:[^"\\\n]|\\.)*")
  | (?P<char>'(?:[^'\\\n]|\\.)*')
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<number>[0-9][0-9A-Za-z_.]*)
  | (?P<op>::|->|&&|\|\||[{}()\[\];,.=<>&*+\-!?:|%/^~#])
''', re.VERBOSE | re.DOTALL)

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0",
            "a": "\a", "b": "\b", "f": "\f", "v": "\v", "?": "?"}


@dataclass(frozen=True)
class Tok:
    kind: str  # "str", "ident", "number", "op", "char"
    value: str


def _unescape(body: str) -> str:
    out = bytearray()
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out += ch.encode("utf-8")
            i += 1
            continue
        nxt = body[i + 1]
        if nxt == "x":
            digits = re.match(r"[0-9a-fA-F]+", body[i + 2:]).group(0)
            out.append(int(digits, 16))
            i += 2 + len(digits)
        elif nxt == "u":
            out += chr(int(body[i + 2:i + 6], 16)).encode("utf-8")
            i += 6
        else:
            out += _ESCAPES[nxt].encode("utf-8")
            i += 2
    return out.decode("utf-8")


@lru_cache(maxsize=8)
def _ref_tokens(name: str, sdist_path: str) -> tuple[Tok, ...]:
    return tuple(tokenize(ref_text(name, sdist_path)))


def ref_tokens(name: str, sdist_path: str) -> list[Tok]:
    """The tokens of a reference file, lexed once per session."""
    return list(_ref_tokens(name, sdist_path))


def tokenize(source: str) -> list[Tok]:
    """C++ tokens; adjacent string literals are joined into one."""
    tokens: list[Tok] = []
    for match in _TOKEN.finditer(source):
        kind = match.lastgroup if match.lastgroup != "delim" else "raw"
        if match.group("space"):
            continue
        if match.group("raw"):
            text, kind = match.group("body"), "str"
        elif match.group("string"):
            literal = match.group("string")
            text, kind = _unescape(literal[literal.index('"') + 1:-1]), "str"
        else:
            kind = next(k for k in ("char", "ident", "number", "op") if match.group(k))
            text = match.group(kind)
        if kind == "str" and tokens and tokens[-1].kind == "str":
            tokens[-1] = Tok("str", tokens[-1].value + text)
        else:
            tokens.append(Tok(kind, text))
    return tokens


class Reader:
    """Reads values from a token list: strings, booleans, identifiers, calls (`f(...)` ->
    ("call", name, args)), and brace lists (-> Python lists)."""

    def __init__(self, tokens: list[Tok], pos: int = 0):
        self.tokens, self.pos = tokens, pos

    def peek(self, offset: int = 0) -> Tok | None:
        at = self.pos + offset
        return self.tokens[at] if at < len(self.tokens) else None

    def take(self, value: str | None = None) -> Tok:
        tok = self.tokens[self.pos]
        if value is not None and tok.value != value:
            raise ValueError(f"expected {value!r}, got {tok.value!r} at token {self.pos}")
        self.pos += 1
        return tok

    def value(self):
        tok = self.take()
        if tok.kind == "str":
            return tok.value
        if tok.value == "{":
            items = []
            while self.peek().value != "}":
                items.append(self.value())
                if self.peek().value == ",":
                    self.take(",")
            self.take("}")
            return items
        if tok.value in ("true", "false"):
            return tok.value == "true"
        if tok.kind == "ident" and self.peek() and self.peek().value == "(":
            self.take("(")
            args = []
            while self.peek().value != ")":
                args.append(self.value())
                if self.peek().value == ",":
                    self.take(",")
            self.take(")")
            if tok.value == "U8C":  # the test's u8 string macro
                return args[0]
            return ("call", tok.value, args)
        if tok.kind == "ident":
            while self.peek() and self.peek().value == "::":  # qualified names
                self.take("::")
                tok = Tok("ident", tok.value + "::" + self.take().value)
            return ("ident", tok.value)
        return tok.value


# -- tests/test-chat-template.cpp --------------------------------------------------------------
@dataclass
class TemplateCase:
    """One TestCase of main_automated_tests."""

    name: str
    template: str
    expected: str  # llama_chat_apply_template's output (--no-jinja)
    expected_jinja: str  # common_chat_templates_apply's; "" means the same as `expected`
    bos_token: str = ""
    eos_token: str = ""
    supported_with_jinja: bool = True
    extra_conversation: list[tuple[str, str]] = field(default_factory=list)


def template_cases() -> tuple[list[tuple[str, str]], list[TemplateCase]]:
    """The conversation and the test cases of test-chat-template.cpp's automated tests."""
    tokens = ref_tokens("test-chat-template.cpp", "tests/test-chat-template.cpp")
    start = _find(tokens, ["conversation", "{"], after="main_automated_tests")
    reader = Reader(tokens, start)
    conversation = [tuple(pair) for pair in reader.value()]
    start = _find(tokens, ["test_cases", "{"], after="main_automated_tests")
    reader = Reader(tokens, start)
    cases = []
    for fields in reader.value():  # positional initializers, trailing fields defaulted
        case = TemplateCase(*fields[:7])
        case.extra_conversation = [tuple(p) for p in (fields[7] if len(fields) > 7 else [])]
        cases.append(case)
    return conversation, cases


def _find(tokens: list[Tok], values: list[str], after: str | None = None) -> int:
    """Index of the last token of the first run of `values` (after the `after` token)."""
    begin = 0
    if after is not None:
        begin = max(i for i, t in enumerate(tokens) if t.value == after)
    for i in range(begin, len(tokens) - len(values) + 1):
        if all(tokens[i + j].value == v for j, v in enumerate(values)):
            return i + len(values) - 1
    raise ValueError(f"{values} not found")


def builtin_template_names() -> list[str]:
    """The keys of LLM_CHAT_TEMPLATES in src/llama-chat.cpp."""
    tokens = ref_tokens("llama-chat.cpp", "src/llama-chat.cpp")
    reader = Reader(tokens, _find(tokens, ["LLM_CHAT_TEMPLATES", "="]) + 1)
    return [entry[0] for entry in reader.value()]


def test_reads_the_template_cases():
    conversation, cases = template_cases()
    assert conversation[0] == ("system", "You are a helpful assistant")
    assert conversation[4] == ("assistant", "   I am an assistant   ")
    assert len(cases) >= 30
    first = cases[0]
    assert first.name == "teknium/OpenHermes-2.5-Mistral-7B"
    assert first.expected.startswith("<|im_start|>system\nYou are a helpful assistant<|im_end|>")
    gigachat = next(c for c in cases if c.name.startswith("ai-sage/GigaChat"))
    assert gigachat.supported_with_jinja is False
    gemma = next(c for c in cases if c.name == "google/gemma-7b-it")
    assert (gemma.bos_token, gemma.eos_token, gemma.extra_conversation) == ("", "", [])
    granite = next(c for c in cases if c.name == "ibm-granite/granite-3.x (tool call)")
    assert granite.extra_conversation[0] == ("user", "What is the weather?")
    assert any("<用户>" in c.template for c in cases)  # U8C(...) literals


def test_reads_the_builtin_names():
    names = builtin_template_names()
    assert names[0] == "chatml" and "llama3" in names and "command-r" in names
    assert len(names) == len(set(names)) >= 50


# -- tests/test-chat.cpp: the PEG parser cases ------------------------------------------------
@dataclass
class PegCase:
    """One `tst.test(input)....run()` chain of test_template_output_peg_parsers."""

    templates: list[str]  # template file base names (a loop runs a chain on several)
    input: str
    calls: list[tuple[str, list]]  # the builder calls in order: (method, arguments)
    line: int = 0  # the index of the chain in the file, for test ids


def _messages_table(tokens: list[Tok]) -> dict[str, dict]:
    """`const common_chat_msg NAME = simple_assist_msg(...)` and `NAME{...}` definitions as
    common_chat_msg fields; messages built by other helpers carry tool calls and are left
    out."""
    table = {}
    for i in range(len(tokens) - 3):
        if tokens[i].value != "common_chat_msg" or tokens[i + 1].kind != "ident":
            continue
        name, nxt = tokens[i + 1].value, tokens[i + 2].value
        if nxt == "=" and tokens[i + 3].value == "simple_assist_msg":
            args = Reader(tokens, i + 3).value()[2]
            args = [*args, "", "", "", ""][:5]
            table[name] = {"role": "assistant", "content": args[0], "reasoning_content": args[1],
                           "tool_calls": [(args[2], args[3], args[4])] if args[2] or args[4]
                           else []}
        elif nxt == "{" and tokens[i - 1].value == "const":
            fields = Reader(tokens, i + 2).value()
            table[name] = {"role": fields[0], "content": fields[1],
                           "content_parts": [tuple(p) for p in fields[2]],
                           "tool_calls": fields[3], "reasoning_content": fields[4]}
    return table


TOOL_METHODS = {"tools", "json_schema", "tool_choice", "parallel_tool_calls",
                "expect_tool_calls"}
_PLAIN_MESSAGE_HELPERS = {"simple_assist_msg"}


def uses_tools(case: PegCase, messages: dict[str, dict]) -> bool:
    """The case sets tools or a JSON schema, or one of its messages has tool calls."""
    for method, args in case.calls:
        if method in TOOL_METHODS:
            return True
        if method in ("expect", "messages"):
            refs = args[0] if method == "messages" else args[:1]
            if any(_has_tool_calls(ref, messages) for ref in refs):
                return True
    return False


def _has_tool_calls(ref, messages: dict[str, dict]) -> bool:
    if ref[0] == "ident":
        return bool(messages.get(ref[1], {"tool_calls": [1]})["tool_calls"])
    args = [*ref[2], "", "", "", ""]
    return ref[1] not in _PLAIN_MESSAGE_HELPERS or bool(args[2] or args[4])


def _tools_table(tokens: list[Tok]) -> dict[str, dict]:
    """`static common_chat_tool NAME{"name", "description", R"(parameters)"}` definitions as
    OpenAI tool JSON (common_chat_tools_to_json_oaicompat)."""
    table = {}
    for i in range(len(tokens) - 3):
        if tokens[i].value == "common_chat_tool" and tokens[i + 1].kind == "ident" \
                and tokens[i + 2].value == "{":
            fields = Reader(tokens, i + 2).value()
            table[tokens[i + 1].value] = tool_json(*fields)
    return table


def tool_json(name: str, description: str, parameters: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": json.loads(parameters)}}


def peg_tools() -> dict[str, dict]:
    """The tools test-chat.cpp defines, by variable name."""
    return _tools_table(ref_tokens("test-chat.cpp", "tests/test-chat.cpp"))


def peg_cases() -> tuple[list[PegCase], dict[str, dict]]:
    """The parser cases of test_template_output_peg_parsers and the messages they use."""
    tokens = ref_tokens("test-chat.cpp", "tests/test-chat.cpp")
    start = _find(tokens, ["test_template_output_peg_parsers", "("])
    stop = _find(tokens, ["test_template_generation_prompt", "("])
    loops: dict[str, list[str]] = {}
    testers: dict[str, list[str]] = {}
    cases: list[PegCase] = []
    i = start
    while i < stop:
        tok = tokens[i]
        if tok.value == ":" and tokens[i + 1].value == "{" and tokens[i - 1].kind == "ident":
            loops[tokens[i - 1].value] = [v for v in Reader(tokens, i + 1).value()
                                          if isinstance(v, str)]
        elif tok.value == "peg_tester" and tokens[i - 1].value == "=":
            arg = tokens[i + 2]
            paths = [arg.value] if arg.kind == "str" else loops.get(arg.value, [])
            testers[tokens[i - 2].value] = [p.rsplit("/", 1)[-1].removesuffix(".jinja")
                                            for p in paths]
        elif tok.value in testers and tokens[i + 1].value == "." \
                and tokens[i + 2].value == "test":
            try:
                case, i = _peg_chain(tokens, i, testers[tok.value])
                cases.append(case)
            except (ValueError, IndexError):  # an input built by an expression: not read
                while tokens[i].value != ";":
                    i += 1
            continue
        i += 1
    return cases, _messages_table(tokens)


def _peg_chain(tokens: list[Tok], at: int, templates: list[str]) -> tuple[PegCase, int]:
    reader = Reader(tokens, at + 3)
    reader.take("(")
    text = reader.value()
    reader.take(")")
    if not isinstance(text, str):
        raise ValueError("the input is not a literal")
    calls = []
    while reader.peek().value == ".":
        reader.take(".")
        method = reader.take().value
        reader.take("(")
        args = []
        while reader.peek().value != ")":
            args.append(reader.value())
            if reader.peek().value == ",":
                reader.take(",")
        reader.take(")")
        calls.append((method, args))
    reader.take(";")
    return PegCase(templates, text, calls, at), reader.pos


def test_reads_the_peg_cases():
    cases, messages = peg_cases()
    assert messages["message_assist_thoughts"]["reasoning_content"] == "I'm\nthinking"
    assert messages["message_assist_prefill_content"]["content"] == "Hello, "
    assert messages["message_user"]["content"] == "Hey there!"
    qwq = [c for c in cases if c.templates == ["Qwen-QwQ-32B"]]
    assert qwq[0].input == "Let me think about this...\n</think>\nThe answer is 42."
    assert ("reasoning_format", [("ident", "COMMON_REASONING_FORMAT_AUTO")]) in qwq[0].calls
    looped = [c for c in cases if "MiMo-VL" in c.templates]
    assert looped and "Qwen-Qwen2.5-7B-Instruct" in looped[0].templates
    assert len(cases) > 100
    assert messages["message_assist_call_id"]["tool_calls"] == [
        ("special_function", '{"arg1":1}', "123456789")]


def test_reads_the_tools():
    tools = peg_tools()
    special = tools["special_function_tool"]["function"]
    assert special["name"] == "special_function" and special["description"] == "I'm special"
    assert special["parameters"]["required"] == ["arg1"]
    assert tools["empty_args_tool_no_schema"]["function"]["parameters"] == {}
    assert tools["calendar_create_event_tool"]["function"]["name"] == "Calendar.create_event"
