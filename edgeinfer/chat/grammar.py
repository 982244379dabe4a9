"""The output grammar as llguidance Lark: llama.cpp's common_peg_arena::build_grammar
(common/peg-parser.cpp), which writes GBNF from the same parser that reads the output.

One grammar describes both: each parser node becomes a Lark expression, each `rule` a
Lark rule, each `schema` an inline `%json {...}` (llguidance compiles the tool's parameters
schema itself). Lookaheads constrain nothing, as in GBNF. Whitespace between parts is
llama.cpp's grammar `space` (nothing, a space, or one or two newlines and indentation).

Lazy grammars (tool_choice "auto"): the root is the trigger rules only, the calls, and the
grammar applies from the trigger word on (see ChatPrompt.grammar_triggers). Otherwise the
root is the whole parser, starting with the generation prompt's prefix, which the engine
feeds before the generated text (llama.cpp's prefill).

Two things differ from GBNF because llguidance lexes text greedily:

* "text up to a marker, then the marker" cannot be two lexemes (the text would swallow
  the marker's first bytes), so `until(D)` followed by `D` becomes one lazy terminal
  `/(?s:.*)D/` that ends at the first D (llama.cpp's `ac` parser is the same thing);
* a marker that is a special token of the vocabulary (`special_tokens`: text -> id) is
  written `<[id]>`: llguidance matches special tokens by id, never as text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from edgeinfer.chat import peg

SPACE_RULE = 'SPACE: /( |\\n{1,2}[ \\t]{0,20})?/'
_ANY_TEXT = "(?s:.*)"


@dataclass(frozen=True)
class GrammarTrigger:
    """common_grammar_trigger: where a lazy grammar starts. `type` is "word": the first
    occurrence of `value` in the generated text (outside reasoning)."""

    type: str
    value: str


def lark_grammar(root: peg.Parser, *, lazy: bool,
                 special_tokens: Mapping[str, int] | None = None) -> str:
    """The Lark text of `root`'s grammar; `lazy` starts it at the trigger rules."""
    writer = _Writer(special_tokens or {})
    if lazy:
        triggers = sorted(writer.trigger_rules(root), key=lambda r: r.name)
        start = " | ".join(writer.rule_ref(r) for r in triggers) or '""'
    else:
        start = writer.expr(root) or '""'
    lines = [f"start: {start}", *writer.lines]
    if writer.uses_space:
        lines.append(SPACE_RULE)
    return "\n".join(lines) + "\n"


_REGEX_META = frozenset("\\.^$|?*+()[]{}/-")
_REGEX_CONTROL = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _regex_literal(text: str) -> str:
    """`text` matched literally inside /.../ (llguidance's Rust regex syntax)."""
    out = []
    for char in text:
        if char in _REGEX_META:
            out.append("\\" + char)
        elif char in _REGEX_CONTROL:
            out.append(_REGEX_CONTROL[char])
        elif ord(char) < 0x20:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(char)
    return "".join(out)


def _lark_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _is_whitespace_filler(p: peg.Parser) -> bool:
    """Parts that only match optional whitespace (or nothing) before a marker."""
    if isinstance(p, (peg._Eps, peg._Space, peg._Not, peg._Peek)):
        return True
    if isinstance(p, peg._Repeat) and p.min_count == 0 and isinstance(p.child, peg._Literal):
        return not p.child.text.strip(peg.SPACE_CHARS)
    return False


class _Writer:
    def __init__(self, special_tokens: Mapping[str, int]):
        self.special = dict(special_tokens)
        self._special_re = re.compile("|".join(
            re.escape(t) for t in sorted(self.special, key=len, reverse=True) if t)) \
            if self.special else None
        self.lines: list[str] = []
        self.uses_space = False
        self._rule_names: dict[int, str] = {}
        self._taken: set[str] = set()
        self._terminals = 0

    # -- rules --------------------------------------------------------------------------------
    def trigger_rules(self, root: peg.Parser) -> list[peg._Rule]:
        found, seen, stack = [], set(), [root]
        while stack:
            p = stack.pop()
            if id(p) in seen:
                continue
            seen.add(id(p))
            if isinstance(p, peg._Rule) and p.trigger:
                found.append(p)
            stack.extend(_children(p))
        return found

    def rule_ref(self, rule: peg._Rule) -> str:
        name = self._rule_names.get(id(rule))
        if name is None:
            name = self._fresh(re.sub(r"[^a-z0-9_-]", "_", rule.name.lower()) or "rule")
            self._rule_names[id(rule)] = name
            body = self.expr(rule.child) or '""'
            self.lines.append(f"{name}: {body}")
        return name

    def _fresh(self, base: str) -> str:
        if not base[0].isalpha() and base[0] != "_":
            base = "r_" + base
        name, n = base, 1
        while name in self._taken:
            n += 1
            name = f"{base}-{n}"
        self._taken.add(name)
        return name

    def _terminal(self, body: str, lazy: bool = False) -> str:
        """A named regex terminal (a rule with the lazy flag when `lazy`)."""
        self._terminals += 1
        if lazy:
            name = f"through_{self._terminals}"
            self.lines.append(f"{name}[lazy]: {body}")
        else:
            name = f"TEXT_{self._terminals}"
            self.lines.append(f"{name}: {body}")
        return name

    # -- expressions --------------------------------------------------------------------------
    def expr(self, p: peg.Parser) -> str:
        method = _EXPRESSIONS.get(type(p))
        if method is None:
            raise TypeError(f"no grammar for {type(p).__name__}")
        return method(self, p)

    def _nothing(self, p) -> str:
        return ""

    def _literal(self, p) -> str:
        return self.literal(p.text)

    def literal(self, text: str) -> str:
        if not text:
            return ""
        if self._special_re is None:
            return _lark_string(text)
        pieces, at = [], 0
        for match in self._special_re.finditer(text):
            if match.start() > at:
                pieces.append(_lark_string(text[at:match.start()]))
            pieces.append(f"<[{self.special[match.group(0)]}]>")
            at = match.end()
        if at < len(text):
            pieces.append(_lark_string(text[at:]))
        return " ".join(pieces)

    def _sequence(self, p) -> str:
        return self.sequence(_flat(p.children))

    def sequence(self, children: list[peg.Parser]) -> str:
        parts = []
        for i, child in enumerate(children):
            delimiter = _trailing_until(child)
            if delimiter is not None and i + 1 < len(children):
                rest = self._strip_sequence(children[i + 1:], delimiter)
                if rest is not None:
                    parts += [self._with_delimiter(child, delimiter), rest]
                    break
            parts.append(self._grouped(child))
        return " ".join(part for part in parts if part)

    def _grouped(self, p: peg.Parser) -> str:
        text = self.expr(p)
        if text and isinstance(_core(p), (peg._Choice, peg._Sequence)) and " " in text \
                and not (text.startswith("(") and text.endswith(")")):
            return f"({text})"
        return text

    def _choice(self, p) -> str:
        alternatives = [self.expr(child) or '""' for child in p.children]
        return "(" + " | ".join(alternatives) + ")" if len(alternatives) > 1 else alternatives[0]

    def _repeat(self, p) -> str:
        return self.repeat(p.child, p.min_count, p.max_count)

    def repeat(self, child: peg.Parser, lo: int, hi: int) -> str:
        inner = self.expr(child)
        if not inner or hi == 0:
            return ""
        inner = f"({inner})"
        if (lo, hi) == (1, 1):
            return inner
        suffix = {(0, 1): "?", (0, -1): "*", (1, -1): "+"}.get((lo, hi))
        if suffix is None:
            suffix = f"{{{lo},}}" if hi == -1 else f"{{{lo},{hi}}}"
        return inner + suffix

    def _space(self, p) -> str:
        self.uses_space = True
        return "SPACE"

    def _any(self, p) -> str:
        return "/(?s:.)/"

    def _chars(self, p) -> str:
        return self.repeat_regex(p.pattern, p.min_count, p.max_count)

    @staticmethod
    def repeat_regex(pattern: str, lo: int, hi: int) -> str:
        return f"/{pattern}{{{lo},{'' if hi == -1 else hi}}}/"

    def _stringcontent(self, p) -> str:
        delim = _regex_literal(p.delimiter)
        return f'/([^{delim}\\\\]|\\\\([{delim}\\\\\\/bfnrt]|u[0-9a-fA-F]{{4}}))*/'

    def _until(self, p) -> str:
        delimiters = [d for d in p.delimiters if d not in self.special]
        if not delimiters:
            return f"/{_ANY_TEXT}/"
        if all(len(d) == 1 for d in delimiters):
            return "/[^" + "".join(_regex_literal(d) for d in delimiters) + "]*/"
        banned = "|".join(_regex_literal(d) for d in delimiters)
        return self._terminal(f"/{_ANY_TEXT}/ & ~/{_ANY_TEXT}({banned}){_ANY_TEXT}/")

    def _through(self, delimiter: str) -> str:
        """Any text up to and including the first `delimiter`."""
        if delimiter in self.special:
            return f"/{_ANY_TEXT}/ {self.literal(delimiter)}"
        return self._terminal(f"/{_ANY_TEXT}{_regex_literal(delimiter)}/", lazy=True)

    def _child(self, p) -> str:
        return self.expr(p.child)

    def _rule(self, p) -> str:
        return self.rule_ref(p)

    def _schema(self, p) -> str:
        schema = p.schema if isinstance(p.schema, dict) else {}
        schema = {**schema, "x-guidance": {**schema.get("x-guidance", {}), "lenient": True}}
        return "%json " + json.dumps(schema, ensure_ascii=False)

    def _json(self, p) -> str:
        return "%json {}"

    def _through_parser(self, p) -> str:
        return self._through(p.delimiter)

    # -- `until(D) D...`: one lazy terminal --------------------------------------------------
    def _with_delimiter(self, p: peg.Parser, delimiter: str) -> str:
        """The grammar of `p` followed by `delimiter`, where `p` ends in `until(delimiter)`:
        that until and the delimiter become one lazy terminal."""
        if isinstance(p, peg._Until):
            return self._through(delimiter)
        if isinstance(p, (peg._Tag, peg._Atomic, peg._Rule)):
            return self._with_delimiter(p.child, delimiter)
        if isinstance(p, peg._Sequence):
            children = _flat(p.children)
            head = self.sequence(children[:-1])
            return " ".join(x for x in (head, self._with_delimiter(children[-1], delimiter)) if x)
        # an optional part: with it, the text through the delimiter; without, the delimiter
        inner = self._with_delimiter(p.child, delimiter)
        return f"(({inner}) | {self.literal(delimiter)})"

    def _strip_sequence(self, children: list[peg.Parser], delimiter: str) -> str | None:
        """The grammar of `children` without the `delimiter` they start with (whitespace
        before it may go: the lazy terminal takes any text), or None."""
        for j, child in enumerate(children):
            if _is_whitespace_filler(child):
                continue
            head = self._strip(child, delimiter)
            if head is None:
                return None
            tail = self.sequence(children[j + 1:])
            return " ".join(part for part in (head, tail) if part)
        return None

    def _strip(self, p: peg.Parser, delimiter: str) -> str | None:
        if isinstance(p, peg._Literal):
            return self.literal(p.text[len(delimiter):]) if p.text.startswith(delimiter) \
                else None
        if isinstance(p, peg._Sequence):
            stripped = self._strip_sequence(_flat(p.children), delimiter)
            return f"({stripped})" if stripped else stripped
        if isinstance(p, peg._Choice):
            alternatives = [self._strip(child, delimiter) for child in p.children]
            if any(a is None for a in alternatives):
                return None
            return "(" + " | ".join(a or '""' for a in alternatives) + ")"
        if isinstance(p, peg._Repeat) and p.min_count >= 1:
            head = self._strip(p.child, delimiter)
            if head is None:
                return None
            hi = p.max_count - 1 if p.max_count != -1 else -1
            return " ".join(x for x in (head, self.repeat(p.child, p.min_count - 1, hi)) if x)
        if isinstance(p, (peg._Rule, peg._Tag, peg._Atomic)):
            return self._strip(p.child, delimiter)
        return None


_EXPRESSIONS = {
    peg._Eps: _Writer._nothing, peg._End: _Writer._nothing, peg._Not: _Writer._nothing,
    peg._Peek: _Writer._nothing, peg._Literal: _Writer._literal,
    peg._Sequence: _Writer._sequence, peg._Choice: _Writer._choice,
    peg._Repeat: _Writer._repeat, peg._Space: _Writer._space, peg._Any: _Writer._any,
    peg._Chars: _Writer._chars, peg._StringContent: _Writer._stringcontent,
    peg._Until: _Writer._until, peg._Tag: _Writer._child, peg._Atomic: _Writer._child,
    peg._JsonValue: _Writer._json, peg._Rule: _Writer._rule, peg._Schema: _Writer._schema,
    peg._Through: _Writer._through_parser,
}


def _trailing_until(p: peg.Parser) -> str | None:
    """D when `p` ends with `until(D)` (D one multi-character marker): `p` is that until,
    or a sequence ending with it, possibly optional, tagged or atomic."""
    while True:
        if isinstance(p, (peg._Tag, peg._Atomic)):
            p = p.child
        elif isinstance(p, peg._Repeat) and (p.min_count, p.max_count) == (0, 1):
            p = p.child
        elif isinstance(p, peg._Sequence) and p.children:
            p = _flat(p.children)[-1]
        else:
            break
    if isinstance(p, peg._Until) and len(p.delimiters) == 1 and len(p.delimiters[0]) > 1:
        return p.delimiters[0]
    return None


def _flat(children: list[peg.Parser]) -> list[peg.Parser]:
    """Nested sequences as one (`a + b + c` builds them left-nested)."""
    out = []
    for child in children:
        out.extend(_flat(child.children) if isinstance(child, peg._Sequence) else [child])
    return out


def _core(p: peg.Parser) -> peg.Parser:
    while isinstance(p, (peg._Tag, peg._Atomic)):
        p = p.child
    return p


def _children(p: peg.Parser) -> list[peg.Parser]:
    if isinstance(p, (peg._Sequence, peg._Choice)):
        return list(p.children)
    child = getattr(p, "child", None)
    return [child] if isinstance(child, peg.Parser) else []


@dataclass(frozen=True)
class LazyStart:
    """Where a lazy grammar begins in the generated text: the first trigger word outside
    reasoning (llama.cpp's grammar triggers; a tool call inside a thinking block is not a
    call). `starts_in_reasoning`: the prompt left the model inside an open thinking block."""

    words: tuple[str, ...]
    think_start: str = ""
    think_ends: tuple[str, ...] = ()
    starts_in_reasoning: bool = False

    def find(self, text: str) -> int | None:
        """The index of the first trigger outside reasoning in `text`, or None."""
        pos, thinking = 0, self.starts_in_reasoning
        while True:
            if thinking:
                ends = [(i, e) for e in self.think_ends if (i := text.find(e, pos)) >= 0]
                if not ends:
                    return None
                i, end = min(ends)
                pos, thinking = i + len(end), False
                continue
            hits = [i for w in self.words if w and (i := text.find(w, pos)) >= 0]
            think = text.find(self.think_start, pos) if self.think_start else -1
            first = min(hits, default=-1)
            if think >= 0 and (first < 0 or think < first):
                pos, thinking = think + len(self.think_start), True
                continue
            return first if first >= 0 else None
