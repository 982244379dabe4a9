"""A small PEG parser engine with llama.cpp's semantics (common/peg-parser.cpp).

llama.cpp parses every model output with a PEG grammar built per chat template, and re-runs
it on the whole text generated so far each time a piece arrives. Two properties make that
work for streaming, and both are reproduced here:

* lenient parsing: a literal cut by the end of the input, or an `until` that reaches the end,
  answers NEED_MORE instead of failing, keeping the AST nodes matched so far. A sequence
  stops at the first NEED_MORE child, so a half-generated marker (`</thi`) is held back
  until it completes or turns out to be text;
* an `until(delimiter)` stops before a delimiter, or before a prefix of one that reaches the
  end of the input.

Only `tag` nodes are recorded (llama.cpp's `rule` nodes are not needed here). Parsers are
built with the functions below and combined with `+` (sequence), `|` (choice) and `<<`
(sequence with optional whitespace between), as in the C++ builder. Strings are Python
strings, so positions count code points where llama.cpp counts UTF-8 bytes; the server
decodes tokens to complete characters before they reach a parser.

A parser is also the source of the grammar that constrains generation (grammar.py):
`rule(name, p, trigger)` names a part of it (trigger rules are where a lazy grammar
starts) and `schema(p, name, schema)` says that `p` (a JSON value) follows a JSON schema.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum

SPACE_CHARS = " \t\n\v\f\r"  # C's isspace in the "C" locale, as llama.cpp's space() uses


class Status(Enum):
    SUCCESS = 0
    FAIL = 1
    NEED_MORE = 2


@dataclass
class Node:
    """A tagged span of the input: `text` is input[start:end]."""

    tag: str
    start: int
    end: int
    text: str
    children: list[Node] = field(default_factory=list)


@dataclass
class Result:
    status: Status
    start: int
    end: int
    nodes: list[Node] = field(default_factory=list)

    @property
    def fail(self) -> bool:
        return self.status is Status.FAIL

    @property
    def success(self) -> bool:
        return self.status is Status.SUCCESS


class Context:
    """The input and whether it may still grow (llama.cpp's COMMON_PEG_PARSE_FLAG_LENIENT)."""

    def __init__(self, text: str, lenient: bool):
        self.text, self.lenient = text, lenient


class Parser:
    """Base class; subclasses implement `parse(ctx, pos)`."""

    def parse(self, ctx: Context, pos: int) -> Result:  # pragma: no cover - abstract
        raise NotImplementedError

    def __add__(self, other: Parser | str) -> Parser:
        return seq(self, other)

    def __radd__(self, other: str) -> Parser:
        return seq(other, self)

    def __or__(self, other: Parser | str) -> Parser:
        return choice(self, other)

    def __lshift__(self, other: Parser | str) -> Parser:
        return seq(self, space(), other)


def _as_parser(item: Parser | str) -> Parser:
    return literal(item) if isinstance(item, str) else item


class _Eps(Parser):
    def parse(self, ctx, pos):
        return Result(Status.SUCCESS, pos, pos)


class _End(Parser):
    def parse(self, ctx, pos):
        return Result(Status.SUCCESS if pos >= len(ctx.text) else Status.FAIL, pos, pos)


class _Literal(Parser):
    def __init__(self, text: str):
        self.text = text

    def parse(self, ctx, pos):
        text, want = ctx.text, self.text
        if text.startswith(want, pos):
            return Result(Status.SUCCESS, pos, pos + len(want))
        have = text[pos:]
        if len(have) < len(want) and want.startswith(have):  # the input ends inside it
            if ctx.lenient:
                return Result(Status.NEED_MORE, pos, len(text))
        return Result(Status.FAIL, pos, pos)


class _Sequence(Parser):
    def __init__(self, children: list[Parser]):
        self.children = children

    def parse(self, ctx, pos):
        start, nodes = pos, []
        for child in self.children:
            result = child.parse(ctx, pos)
            if result.fail:
                return Result(Status.FAIL, start, result.end)
            nodes += result.nodes
            if result.status is Status.NEED_MORE:
                return Result(Status.NEED_MORE, start, result.end, nodes)
            pos = result.end
        return Result(Status.SUCCESS, start, pos, nodes)


class _Choice(Parser):
    def __init__(self, children: list[Parser]):
        self.children = children

    def parse(self, ctx, pos):
        for child in self.children:
            result = child.parse(ctx, pos)
            if not result.fail:
                return result
        return Result(Status.FAIL, pos, pos)


class _Repeat(Parser):
    def __init__(self, child: Parser, min_count: int, max_count: int):
        self.child, self.min_count, self.max_count = child, min_count, max_count

    def parse(self, ctx, pos):
        start, count, nodes = pos, 0, []
        while self.max_count == -1 or count < self.max_count:
            if pos >= len(ctx.text):
                break
            result = self.child.parse(ctx, pos)
            if result.success:
                if result.end == pos:  # an empty match would loop forever
                    break
                nodes += result.nodes
                pos, count = result.end, count + 1
                continue
            if result.status is Status.NEED_MORE:
                return Result(Status.NEED_MORE, start, result.end, nodes + result.nodes)
            break
        if count < self.min_count:
            if pos >= len(ctx.text) and ctx.lenient:
                return Result(Status.NEED_MORE, start, pos, nodes)
            return Result(Status.FAIL, start, pos)
        return Result(Status.SUCCESS, start, pos, nodes)


class _Until(Parser):
    """Everything up to the first delimiter, or up to a delimiter prefix that ends the input.
    With no delimiters this is `rest()`: the whole remaining input."""

    def __init__(self, delimiters: tuple[str, ...]):
        self.delimiters = tuple(d for d in delimiters if d)

    def _stop(self, text: str, pos: int) -> int:
        stop = len(text)
        for delim in self.delimiters:
            found = text.find(delim, pos, stop + len(delim) - 1)
            if found != -1:
                stop = min(stop, found)
            for at in range(max(pos, len(text) - len(delim) + 1), min(stop, len(text))):
                if delim.startswith(text[at:]):  # a partial delimiter reaching the end
                    stop = at
                    break
        return stop

    def parse(self, ctx, pos):
        stop = self._stop(ctx.text, pos)
        if stop == len(ctx.text) and ctx.lenient:
            return Result(Status.NEED_MORE, pos, stop)
        return Result(Status.SUCCESS, pos, stop)


class _Space(Parser):
    def parse(self, ctx, pos):
        text, end = ctx.text, pos
        while end < len(text) and text[end] in SPACE_CHARS:
            end += 1
        return Result(Status.SUCCESS, pos, end)


class _Tag(Parser):
    def __init__(self, name: str, child: Parser):
        self.name, self.child = name, child

    def parse(self, ctx, pos):
        result = self.child.parse(ctx, pos)
        if result.fail:
            return result
        node = Node(self.name, result.start, result.end, ctx.text[result.start:result.end],
                    result.nodes)
        return Result(result.status, result.start, result.end, [node])


class _Atomic(Parser):
    """Nodes are only kept once the child completed: a half-parsed one emits nothing."""

    def __init__(self, child: Parser):
        self.child = child

    def parse(self, ctx, pos):
        result = self.child.parse(ctx, pos)
        if result.status is Status.NEED_MORE:
            result.nodes = []
        return result


class _Peek(Parser):
    def __init__(self, child: Parser):
        self.child = child

    def parse(self, ctx, pos):
        return Result(self.child.parse(ctx, pos).status, pos, pos)


class _Not(Parser):
    """Negative lookahead: succeeds without consuming when the child fails; a child that
    needs more input makes it need more input too."""

    def __init__(self, child: Parser):
        self.child = child

    def parse(self, ctx, pos):
        result = self.child.parse(ctx, pos)
        if result.success:
            return Result(Status.FAIL, pos, pos)
        status = Status.NEED_MORE if result.status is Status.NEED_MORE else Status.SUCCESS
        return Result(status, pos, pos)


class _Any(Parser):
    def parse(self, ctx, pos):
        if pos < len(ctx.text):
            return Result(Status.SUCCESS, pos, pos + 1)
        return Result(Status.NEED_MORE if ctx.lenient else Status.FAIL, pos, pos)


class _Chars(Parser):
    """`count` characters of a class (`pattern` is a regex character class such as
    "[0-9]"); the end of the input is incomplete, not a mismatch (common_peg_chars_parser)."""

    def __init__(self, pattern: str, min_count: int, max_count: int):
        self.pattern, self.min_count, self.max_count = pattern, min_count, max_count
        self._class = re.compile(pattern)

    def parse(self, ctx, pos):
        start, count, text = pos, 0, ctx.text
        while self.max_count == -1 or count < self.max_count:
            if pos >= len(text):
                if count >= self.min_count:
                    return Result(Status.SUCCESS, start, pos)
                return Result(Status.NEED_MORE if ctx.lenient else Status.FAIL, start, pos)
            if not self._class.fullmatch(text[pos]):
                break
            pos, count = pos + 1, count + 1
        if count < self.min_count:
            return Result(Status.FAIL, start, pos)
        return Result(Status.SUCCESS, start, pos)


class _StringContent(Parser):
    """The inside of a quoted string up to the unescaped closing `delimiter` (not consumed);
    an escape cut by the end of the input is held back (common_peg_string_parser)."""

    _SIMPLE_ESCAPES = frozenset('\\/bfnrt')

    def __init__(self, delimiter: str):
        self.delimiter = delimiter

    def parse(self, ctx, pos):
        text, start = ctx.text, pos
        while pos < len(text):
            char = text[pos]
            if char == self.delimiter:
                return Result(Status.SUCCESS, start, pos)
            if char != "\\":
                pos += 1
                continue
            escape = self._escape(text, pos)
            if escape is None:
                return Result(Status.FAIL, start, start)
            if escape == pos:  # cut by the end of the input: hold the backslash back
                return Result(Status.NEED_MORE if ctx.lenient else Status.FAIL, start, pos)
            pos = escape
        return Result(Status.NEED_MORE if ctx.lenient else Status.FAIL, start, pos)

    def _escape(self, text: str, pos: int) -> int | None:
        """Where the escape at `pos` ends: `pos` itself when the input ends inside it, None
        when it is invalid."""
        if pos + 1 >= len(text):
            return pos
        kind = text[pos + 1]
        if kind == self.delimiter or kind in self._SIMPLE_ESCAPES:
            return pos + 2
        if kind != "u":
            return None
        digits = text[pos + 2:pos + 6]
        if not all(c in "0123456789abcdefABCDEF" for c in digits):
            return None
        return pos + 6 if len(digits) == 4 else pos


class _Rule(Parser):
    """A named part of the grammar; `trigger` rules are where a lazy grammar starts."""

    def __init__(self, name: str, child: Parser, trigger: bool = False):
        self.name, self.child, self.trigger = name, child, trigger

    def parse(self, ctx, pos):
        return self.child.parse(ctx, pos)


class _Schema(Parser):
    """A JSON value parsed by `child` whose grammar is the JSON schema `schema`."""

    def __init__(self, child: Parser, name: str, schema: dict):
        self.child, self.name, self.schema = child, name, schema

    def parse(self, ctx, pos):
        return self.child.parse(ctx, pos)


class _Through(Parser):
    """Parses as `child`; its grammar is "any text up to and including the first
    `delimiter`" (common_peg_ac_parser), for a value that runs to a closing marker."""

    def __init__(self, child: Parser, delimiter: str):
        self.child, self.delimiter = child, delimiter

    def parse(self, ctx, pos):
        return self.child.parse(ctx, pos)


class _JsonValue(Parser):
    """A JSON value scanned directly. Statuses and end positions are those of llama.cpp's
    combinators: a literal, string or number cut by the end of the input needs more (a
    number even when complete, as "3" may become "3.14"); an unfinished object or array
    needs more at the end of the input; optional parts are not tried there."""

    _DIGITS = frozenset("0123456789")
    _NUMBER_CHARS = frozenset("0123456789.eE+-")

    def parse(self, ctx, pos):
        try:
            status, end = self._value(ctx, pos)
        except RecursionError:
            status, end = Status.FAIL, pos
        return Result(status, pos, end)

    def _value(self, ctx, pos):
        text = ctx.text
        if pos >= len(text):
            return self._more(ctx, pos, len(text))
        char = text[pos]
        if char == "{":
            return self._container(ctx, pos, "}", member=True)
        if char == "[":
            return self._container(ctx, pos, "]", member=False)
        if char == '"':
            return self._string(ctx, pos)
        if char == "-" or char in self._DIGITS:
            return self._number(ctx, pos)
        for word in ("true", "false", "null"):
            result = _Literal(word).parse(ctx, pos)
            if not result.fail:
                return result.status, result.end
        return Status.FAIL, pos

    @staticmethod
    def _more(ctx, pos, end):
        return (Status.NEED_MORE, end) if ctx.lenient else (Status.FAIL, pos)

    @staticmethod
    def _space(text, pos):
        while pos < len(text) and text[pos] in SPACE_CHARS:
            pos += 1
        return pos

    def _container(self, ctx, pos, close, member):
        """`{ members }` or `[ elements ]` with llama.cpp's optional-part rules."""
        text, start = ctx.text, pos
        pos = self._space(text, pos + 1)
        if pos >= len(text):
            return self._more(ctx, start, len(text))
        if text[pos] == close:
            return Status.SUCCESS, pos + 1
        status, pos = self._item(ctx, pos, member)
        while status is Status.SUCCESS and pos < len(text):
            after = self._space(text, pos)
            if after >= len(text):
                return self._more(ctx, start, len(text))
            if text[after] != ",":
                break
            status, pos = self._item(ctx, self._space(text, after + 1), member)
        if status is not Status.SUCCESS:
            return status, pos
        pos = self._space(text, pos)
        if pos >= len(text):
            return self._more(ctx, start, len(text))
        return (Status.SUCCESS, pos + 1) if text[pos] == close else (Status.FAIL, pos)

    def _item(self, ctx, pos, member):
        if not member:
            return self._value(ctx, pos)
        text = ctx.text
        if pos >= len(text):
            return self._more(ctx, pos, len(text))
        if text[pos] != '"':
            return Status.FAIL, pos
        status, pos = self._string(ctx, pos)
        if status is not Status.SUCCESS:
            return status, pos
        pos = self._space(text, pos)
        if pos >= len(text):
            return self._more(ctx, pos, len(text))
        if text[pos] != ":":
            return Status.FAIL, pos
        return self._value(ctx, self._space(text, pos + 1))

    def _string(self, ctx, pos):
        result = _StringContent('"').parse(ctx, pos + 1)
        if result.status is not Status.SUCCESS:
            return result.status, result.end
        return Status.SUCCESS, result.end + 1

    def _number(self, ctx, pos):
        text, start = ctx.text, pos
        if text[pos] == "-":
            pos += 1
            if pos >= len(text):
                return self._more(ctx, start, len(text))
        if text[pos] == "0":
            pos += 1
        elif text[pos] in self._DIGITS:
            pos = self._digits(text, pos)
        else:
            return Status.FAIL, pos
        for marker, signs in ((".", ""), ("eE", "+-")):
            if pos < len(text) and text[pos] in marker:
                pos += 1
                if signs and pos < len(text) and text[pos] in signs:
                    pos += 1
                if pos >= len(text):
                    return self._more(ctx, start, len(text))
                if text[pos] not in self._DIGITS:
                    return Status.FAIL, pos
                pos = self._digits(text, pos)
        if pos >= len(text):  # the next character could still extend it
            return (Status.NEED_MORE, pos) if ctx.lenient else (Status.SUCCESS, pos)
        return (Status.FAIL, pos) if text[pos] in self._NUMBER_CHARS else (Status.SUCCESS, pos)

    def _digits(self, text, pos):
        while pos < len(text) and text[pos] in self._DIGITS:
            pos += 1
        return pos


_JSON_VALUE = _Rule("json-value", _JsonValue())


def eps() -> Parser:
    return _Eps()


def end() -> Parser:
    return _End()


def literal(text: str) -> Parser:
    return _Literal(text) if text else _Eps()


def seq(*items: Parser | str) -> Parser:
    return _Sequence([_as_parser(item) for item in items])


def choice(*items: Parser | str) -> Parser:
    return _Choice([_as_parser(item) for item in items])


def repeat(item: Parser | str, min_count: int, max_count: int) -> Parser:
    return _Repeat(_as_parser(item), min_count, max_count)


def optional(item: Parser | str) -> Parser:
    return repeat(item, 0, 1)


def zero_or_more(item: Parser | str) -> Parser:
    return repeat(item, 0, -1)


def one_or_more(item: Parser | str) -> Parser:
    return repeat(item, 1, -1)


def until(*delimiters: str) -> Parser:
    return _Until(delimiters)


def rest() -> Parser:
    return _Until(())


def space() -> Parser:
    return _Space()


def tag(name: str, item: Parser | str) -> Parser:
    return _Tag(name, _as_parser(item))


def atomic(item: Parser | str) -> Parser:
    return _Atomic(_as_parser(item))


def peek(item: Parser | str) -> Parser:
    return _Peek(_as_parser(item))


def negate(item: Parser | str) -> Parser:
    return _Not(_as_parser(item))


def any_char() -> Parser:
    return _Any()


def chars(pattern: str, min_count: int = 1, max_count: int = -1) -> Parser:
    return _Chars(pattern, min_count, max_count)


def string_content(delimiter: str) -> Parser:
    return _StringContent(delimiter)


def rule(name: str, item: Parser | str, trigger: bool = False) -> Parser:
    return _Rule(name, _as_parser(item), trigger)


def trigger_rule(name: str, item: Parser | str) -> Parser:
    return _Rule(name, _as_parser(item), True)


def schema(item: Parser, name: str, json_schema: dict) -> Parser:
    return _Schema(item, name, json_schema)


def through(item: Parser, delimiter: str) -> Parser:
    """llama.cpp's `ac(p, delimiter)`."""
    return _Through(item, delimiter)


def marker() -> Parser:
    """`<...>` or `[...]`: what llama.cpp's template analysis calls a marker."""
    return choice(literal("<") + until(">") + ">", literal("[") + until("]") + "]")


def optspace(text: str) -> Parser:
    """The text with its leading and trailing whitespace characters each optional
    (common_chat_peg_builder::optspace)."""
    core = text.strip(SPACE_CHARS)
    if not core:
        return seq(*(optional(c) for c in text))
    lead = text[: len(text) - len(text.lstrip(SPACE_CHARS))]
    trail = text[len(text.rstrip(SPACE_CHARS)):]
    return seq(*(optional(c) for c in lead), core, *(optional(c) for c in trail))


# -- JSON (common_peg_parser_builder::json and friends) ----------------------------------------
def json_string() -> Parser:
    return rule("json-string", seq('"', string_content('"'), '"'))


def json_number() -> Parser:
    """The number is only complete when the next character cannot extend it, so "3" at the
    end of a stream waits for a possible ".14"."""
    int_part = choice("0", seq(chars("[1-9]", 1, 1), chars("[0-9]", 0, -1)))
    frac = seq(".", chars("[0-9]"))
    exp = seq(choice("e", "E"), optional(chars("[+-]", 1, 1)), chars("[0-9]"))
    return rule("json-number", seq(optional("-"), int_part, optional(frac), optional(exp),
                                   negate(chars("[0-9.eE+-]", 1, 1))))


def json_value() -> Parser:
    """Any JSON value, leniently: an object or array cut by the end of the input needs more.
    One scanner (_JsonValue) with the semantics of llama.cpp's combinator grammar
    (json_object, json_array, json_string, json_number, json_bool, json_null), which is
    quadratic to re-run in Python on every streamed piece."""
    return _JSON_VALUE


def walk(nodes: list[Node]):
    """Pre-order traversal, the order llama.cpp's mappers see nodes in."""
    for node in nodes:
        yield node
        yield from walk(node.children)


def parse(parser: Parser, text: str, *, lenient: bool, start: int = 0) -> Result:
    return parser.parse(Context(text, lenient), start)


def extract_tags(parser: Parser, text: str, *, anywhere: bool = False) -> tuple[Result, dict]:
    """llama.cpp's tagged_peg_parser: a strict parse, and the text of each tag (the last one
    of a name wins). `anywhere` retries from each start position until one succeeds
    (parse_anywhere_and_extract)."""
    starts = range(max(len(text), 1)) if anywhere else range(1)
    for start in starts:
        result = parse(parser, text, lenient=False, start=start)
        if result.success or start == starts[-1]:
            return result, {node.tag: node.text for node in walk(result.nodes)}
    raise AssertionError("unreachable")
