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
"""

from __future__ import annotations

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
