"""Constraints (a GBNF or Lark grammar, a JSON schema, a regex) compiled for one vocabulary.

A `Constraint` is what a request asks for; `compile_constraint` turns it into a
`CompiledConstraint` for a tokenizer, once: compiled constraints are cached per tokenizer by
their text, and each sequence starts from a copy of the cached matcher (a copy costs
microseconds, a compile milliseconds).

How each kind reaches llguidance (`KINDS`):

* `gbnf`: llama.cpp's grammar syntax, converted to Lark by llguidance's own `gbnf_to_lark`
  (root becomes start). llama.cpp itself sends only grammars starting with `%llguidance` to
  llguidance, as Lark; `Constraint.from_llama_grammar` makes the same choice. A difference
  from llama.cpp's own engine: the converter makes every rule built only of literals and
  character classes a lexer terminal, and terminals match greedily, so one that ends in
  optional text the next symbol could also start with swallows it (llama.cpp's
  arithmetic.gbnf: `num ::= [0-9]+ ws`, `ws ::= [ \\t\\n]*`, then `"\\n"` refuses "1 = 2\\n");
  keeping such rules as grammar rules fixes that at about 90 times the mask time of JSON-like
  grammars, so it is not done;
* `lark`: llguidance's Lark dialect (`%json {...}` inside, `<|special|>` tokens, `%llguidance`);
* `json_schema`: a JSON schema (Draft 2020-12 semantics, llguidance's docs/json_schema.md);
* `json_object`: any JSON object, the schema `{"type": "object"}` llama-server uses for
  `response_format: {"type": "json_object"}`;
* `regex`: a Rust-regex-syntax regular expression the whole output must match.

JSON options (`JSON_DEFAULTS`, given as llguidance's `defaults`, so a schema's own top-level
`"x-guidance"` still overrides them):

* whitespace is llama.cpp's: its json-schema-to-grammar `space` rule (`SPACE_RULE`, one space,
  or one or two newlines and up to 20 spaces or tabs) wherever JSON allows whitespace, instead
  of llguidance's unbounded `[ \\t\\n\\r]+`, which lets a small model emit whitespace until the
  token limit. Compact JSON and `json.dumps`'s default and `indent=` output (to depth 10 with
  two-space indents) all fit; no whitespace before the value or after it (llama.cpp allows
  trailing whitespace, which changes nothing in the JSON);
* separators are llguidance's defaults, `,` and `:`;
* strings may use `\\uXXXX` escapes for any character (surrogate pairs included), as
  `json.dumps` writes them by default; llguidance allows them only for control characters
  unless asked. Constants, enums, patterns and property names must still be written
  literally: `"\\u00fc"` does not match the enum value `"ü"`;
* properties come in the order the schema lists them (llguidance's rule, and llama.cpp's GBNF
  path's too, though it puts required properties first);
* `additionalProperties` defaults to JSON Schema's `true`, as with llama.cpp's llguidance
  build; llama.cpp's GBNF converter instead forbids unlisted properties when `properties` is
  given, so its outputs are a subset of ours;
* `format` is enforced for the formats llguidance implements (date-time, time, date, duration,
  email, hostname, ipv4, ipv6, uuid, uri); an unknown format is an annotation, as JSON Schema
  2020-12 says, and not an error (llguidance's strict mode refuses it);
* a keyword llguidance does not implement (`not`, `uniqueItems`, `contains`, `if`/`then`,
  `dependencies`, a `oneOf` whose branches it cannot prove disjoint, ...) is an error naming it,
  unless the caller allows `approximate` compilation: then it is ignored (llguidance's `lenient`,
  which also treats `oneOf` as `anyOf`), the outputs may violate that keyword, and the compiled
  constraint says so (`exact` False, `warnings` naming what was ignored). llama.cpp's GBNF
  converter ignores such keywords silently; its llguidance build refuses them.

Errors are one-line `EdgeInferError`s from llguidance's own messages: the GBNF line and the text
around the fault, the Lark line and column, the regex fault, the unimplemented keywords.
"""

from __future__ import annotations

import json
import re
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgeinfer.errors import EdgeInferError
from edgeinfer.structured import bridge

if TYPE_CHECKING:
    from edgeinfer.structured.sequence import SequenceConstraint
    from edgeinfer.tokenizer import Tokenizer

# llama.cpp common/json-schema-to-grammar.cpp: SPACE_RULE = `| " " | "\n"{1,2} [ \t]{0,20}`
SPACE_RULE = r"(?: |\n{1,2}[ \t]{0,20})"
JSON_DEFAULTS: dict[str, Any] = {
    "whitespace_pattern": SPACE_RULE,
    "json_allow_general_unicode_escapes": True,  # "\u00e9" as well as "é" in free strings
}
JSON_OBJECT_SCHEMA = '{"type": "object"}'
LLAMA_LLGUIDANCE_PREFIX = "%llguidance"  # llama.cpp common/sampling.cpp
CACHE_SIZE = 64  # compiled constraints kept per tokenizer

# llguidance warnings that leave a lenient compile exact: formats are annotations in 2020-12.
_EXACT_WARNING = re.compile(r"Unknown format: .*")
_SOURCE_LINE = re.compile(r"^\s*(\d+ \||\^+$)")  # llguidance's quoted source and its caret
_LARK_POSITION = re.compile(r"^(?:at )?(\d+)\((\d+)\): ")


@dataclass(frozen=True)
class Constraint:
    """What the output must match: `kind` (a key of `KINDS`) and its text (a grammar, a regex,
    or a JSON schema serialized with its key order kept; empty for `json_object`)."""

    kind: str
    text: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise EdgeInferError(f"unknown constraint kind {self.kind!r} (known: "
                                 f"{', '.join(KINDS)})")

    @classmethod
    def json_schema(cls, schema: dict | str) -> Constraint:
        """A JSON schema given as a dict or as its text; it must be a JSON object."""
        text = schema
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as exc:
                raise EdgeInferError(f"json_schema is not valid JSON: {exc}") from None
        if not isinstance(schema, dict):
            raise EdgeInferError(f"json_schema must be a JSON object, not "
                                 f"{type(schema).__name__}")
        if not isinstance(text, str):
            text = json.dumps(schema, ensure_ascii=False)
        return cls("json_schema", text)

    @classmethod
    def from_llama_grammar(cls, text: str) -> Constraint:
        """llama-server's `grammar` field: Lark if it starts with `%llguidance`, else GBNF."""
        kind = "lark" if text.startswith(LLAMA_LLGUIDANCE_PREFIX) else "gbnf"
        return cls(kind, text)


@dataclass(frozen=True)
class CompiledConstraint:
    """A constraint compiled for one vocabulary. `exact` is False when keywords llguidance
    cannot enforce were ignored (`warnings` names them); `seconds` is the compile time."""

    constraint: Constraint
    grammar: str  # llguidance's serialized grammar
    exact: bool
    warnings: tuple[str, ...]
    seconds: float
    n_vocab: int
    template: Any = field(repr=False)  # a fresh llguidance.LLMatcher, copied per sequence

    def start(self) -> SequenceConstraint:
        """A new sequence's state at the start of the output."""
        from edgeinfer.structured.sequence import SequenceConstraint

        return SequenceConstraint(self, self.template.deep_copy())


def _gbnf(text: str) -> str:
    from llguidance.gbnf_to_lark import gbnf_to_lark

    try:
        lark = gbnf_to_lark(text)
    except Exception as exc:  # GbnfToLarkError, and plain Exception for unknown rules
        raise EdgeInferError(f"gbnf constraint: {one_line(str(exc))}") from None
    return bridge.llguidance().LLMatcher.grammar_from_lark(lark)


def _json_schema(text: str, lenient: bool) -> str:
    options = {**JSON_DEFAULTS, "lenient": lenient}
    return bridge.llguidance().LLMatcher.grammar_from_json_schema(text, defaults=options)


# kind -> (text -> llguidance grammar, lenient=False/True)
KINDS: dict[str, Callable[[str, bool], str]] = {
    "gbnf": lambda text, lenient: _gbnf(text),
    "lark": lambda text, lenient: bridge.llguidance().LLMatcher.grammar_from_lark(text),
    "json_schema": _json_schema,
    "json_object": lambda text, lenient: _json_schema(JSON_OBJECT_SCHEMA, lenient),
    "regex": lambda text, lenient: bridge.llguidance().LLMatcher.grammar_from_regex(text),
}


def one_line(message: str) -> str:
    """llguidance's multi-line message as one line: its first line and any `error:` detail,
    without the quoted source lines and carets."""
    lines = [ln.strip() for ln in message.splitlines()]
    kept = [ln for ln in lines if ln and not _SOURCE_LINE.match(ln)]
    head, details = kept[:1], [ln.removeprefix("error:").strip() for ln in kept[1:]
                              if ln.startswith("error:")]
    return " ".join(head + details) or "invalid constraint"


def _describe(constraint: Constraint, grammar: str, message: str) -> str:
    """The error, with llguidance's `at LINE(COLUMN): ` made readable for the kind: a Lark
    position as such; in a converted GBNF grammar the converted rule (GBNF has no such line);
    none for a regex (the position is in llguidance's `start: /.../` wrapper)."""
    text = one_line(message)
    position = _LARK_POSITION.match(text)
    if position:
        row, column, rest = int(position.group(1)), position.group(2), text[position.end():]
        if constraint.kind == "lark":
            text = f"line {row}, column {column}: {rest}"
        elif constraint.kind == "gbnf":
            lines = grammar.splitlines()
            rule = lines[row - 1].strip() if 0 < row <= len(lines) else ""
            text = f"{rest} (in the rule {rule!r} converted to Lark)"
        else:
            text = rest
    return f"{constraint.kind} constraint: {text}"


def _build(tokenizer: Tokenizer, constraint: Constraint, lenient: bool):
    """(matcher, grammar, warnings) or raise the one-line error."""
    llg = bridge.llguidance()
    ll = bridge.ll_tokenizer(tokenizer)
    try:
        grammar = KINDS[constraint.kind](constraint.text, lenient)
    except ValueError as exc:  # llguidance refuses a schema that is not a JSON object
        raise EdgeInferError(f"{constraint.kind} constraint: {one_line(str(exc))}") from None
    matcher = llg.LLMatcher(ll, grammar, log_level=0)
    if matcher.is_error():
        raise EdgeInferError(_describe(constraint, grammar, matcher.get_error()))
    return matcher, grammar, tuple(matcher.get_grammar_warnings())


def _is_exact(warnings: tuple[str, ...]) -> bool:
    return all(_EXACT_WARNING.fullmatch(w) for w in warnings)


def _compile(tokenizer: Tokenizer, constraint: Constraint, approximate: bool
             ) -> CompiledConstraint:
    started = time.perf_counter()
    try:
        matcher, grammar, warnings = _build(tokenizer, constraint, lenient=False)
    except EdgeInferError as strict_error:
        matcher, grammar, warnings = _lenient(tokenizer, constraint, approximate, strict_error)
    return CompiledConstraint(constraint, grammar, _is_exact(warnings), warnings,
                              time.perf_counter() - started, tokenizer.n_vocab, matcher)


def _lenient(tokenizer: Tokenizer, constraint: Constraint, approximate: bool,
             strict_error: EdgeInferError):
    """A JSON schema llguidance refuses, compiled again ignoring what it does not implement.
    Taken if all it ignored was unknown formats (annotations in 2020-12: exact), or anything
    when `approximate`; otherwise the strict error stands."""
    if constraint.kind not in ("json_schema", "json_object"):
        raise strict_error
    try:
        built = _build(tokenizer, constraint, lenient=True)
    except EdgeInferError as lenient_error:
        if approximate and lenient_error.args != strict_error.args:
            detail = str(lenient_error).split(": ", 1)[1]
            raise EdgeInferError(f"{strict_error}; and with that ignored: {detail}") from None
        raise strict_error from None
    if approximate or _is_exact(built[2]):
        return built
    raise strict_error


class ConstraintCache:
    """Compiled constraints by (constraint, approximate), least recently used dropped first;
    safe to share between threads (a compile runs outside the lock)."""

    def __init__(self, size: int = CACHE_SIZE):
        self.size = size
        self._entries: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, tokenizer: Tokenizer, constraint: Constraint, approximate: bool
            ) -> CompiledConstraint:
        key = (constraint, approximate)
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                return found
        compiled = _compile(tokenizer, constraint, approximate)
        with self._lock:
            self._entries[key] = compiled
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return compiled


_caches_lock = threading.Lock()
_caches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Tokenizer -> its cache


def _cache_for(tokenizer: Tokenizer) -> ConstraintCache:
    with _caches_lock:
        cache = _caches.get(tokenizer)
        if cache is None:
            cache = _caches[tokenizer] = ConstraintCache()
        return cache


def compile_constraint(tokenizer: Tokenizer, constraint: Constraint,
                       approximate: bool = False) -> CompiledConstraint:
    """Compile `constraint` for `tokenizer`'s vocabulary, or return the cached result. Raises
    a one-line EdgeInferError saying why a constraint cannot be compiled; with `approximate`,
    a JSON schema using keywords llguidance does not implement compiles with them ignored
    (`exact` False) instead."""
    return _cache_for(tokenizer).get(tokenizer, constraint, approximate)
