"""The constraint core (edgeinfer/structured): the tokenizer bridge, compiling constraints and
their errors, per-sequence state and batched masks.

Every tokenizer-dependent test runs on the tiny model's byte-level vocabulary and on the real
models' tokenizers (SmolLM2's 49k BPE, Gemma 3's 262k SentencePiece; skipped when not pulled).
Instance labels are checked with `jsonschema` first, the independent reference; then each
instance is tokenized with our tokenizer and fed token by token through the masks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tiny_models import write_tiny_model

from edgeinfer.errors import EdgeInferError
from edgeinfer.gguf_file import GGUFFile
from edgeinfer.tokenizer import Tokenizer
from edgeinfer.tokenizer_tables import PARSE_SPECIAL_ATTRS

llguidance = pytest.importorskip("llguidance", reason="the structured extra is not installed")
jsonschema = pytest.importorskip("jsonschema")

from edgeinfer.structured import (  # noqa: E402
    Constraint,
    MaskBatch,
    apply_bitmask,
    compile_constraint,
    ll_tokenizer,
    mask_allows,
    mask_words,
)
from edgeinfer.structured.bridge import INSTALL_HINT, eog_order  # noqa: E402

# llama.cpp's grammars/*.gbnf, fetched by scripts/fetch_vocab_tests.py
GBNF_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edgeinfer" \
    / "grammars"


def gbnf(name: str) -> str:
    path = GBNF_DIR / f"{name}.gbnf"
    if not path.exists():
        pytest.skip(f"{path} is absent (scripts/fetch_vocab_tests.py fetches llama.cpp's "
                    "grammars)")
    return path.read_text(encoding="utf-8")
REAL = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": "gemma-3-270m-q4_k_m.gguf"}


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory) -> Tokenizer:
    tmp = tmp_path_factory.mktemp("tiny")
    return Tokenizer.from_metadata(GGUFFile(write_tiny_model(tmp / "tiny.gguf")).metadata,
                                   cache_dir=tmp)


@pytest.fixture(scope="module", params=["tiny", pytest.param("smollm2", marks=pytest.mark.real),
                                        pytest.param("gemma3", marks=pytest.mark.real)])
def tokenizer(request, tiny_tokenizer, real_model) -> Tokenizer:
    if request.param == "tiny":
        return tiny_tokenizer
    return _real_tokenizer(real_model(REAL[request.param]))


_REAL_TOKENIZERS: dict[Path, Tokenizer] = {}


def _real_tokenizer(path: Path) -> Tokenizer:
    if path not in _REAL_TOKENIZERS:
        _REAL_TOKENIZERS[path] = Tokenizer.from_metadata(GGUFFile(path).metadata)
    return _REAL_TOKENIZERS[path]


def walk(tokenizer: Tokenizer, seq, text: str) -> int | None:
    """Feed text's tokens through the masks; the index of the first one refused, or None
    if all were allowed (each allowed one must then be accepted)."""
    row = np.zeros(mask_words(tokenizer.n_vocab), dtype=np.int32)
    for i, token in enumerate(tokenizer.encode(text, add_special=False, parse_special=False)):
        seq.fill_mask(row)
        if not mask_allows(row, token):
            return i
        assert seq.accept(token), f"token {i} allowed by the mask but refused: {seq.error}"
    return None


def ends_cleanly(tokenizer: Tokenizer, seq) -> bool:
    """Accepting, and end-of-generation allowed exactly then."""
    row = np.zeros(mask_words(tokenizer.n_vocab), dtype=np.int32)
    seq.fill_mask(row)
    eog_allowed = {mask_allows(row, t) for t in eog_order(tokenizer)}
    assert eog_allowed == {seq.is_accepting()}
    return seq.is_accepting()


def accepts(tokenizer: Tokenizer, constraint: Constraint, text: str) -> bool:
    seq = compile_constraint(tokenizer, constraint).start()
    return walk(tokenizer, seq, text) is None and ends_cleanly(tokenizer, seq)


# -- without llguidance ----------------------------------------------------------------------


def test_importing_needs_no_llguidance():
    code = "import edgeinfer, edgeinfer.structured, sys; print('llguidance' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_missing_llguidance_is_a_one_line_hint(tmp_path, monkeypatch):
    tk = Tokenizer.from_metadata(GGUFFile(write_tiny_model(tmp_path / "t.gguf")).metadata,
                                 cache_dir=tmp_path)
    monkeypatch.setitem(sys.modules, "llguidance", None)  # import llguidance -> ImportError
    with pytest.raises(EdgeInferError) as info:
        compile_constraint(tk, Constraint("regex", "a+"))
    assert str(info.value) == INSTALL_HINT


# -- the tokenizer bridge --------------------------------------------------------------------


def test_bridge_gives_llguidance_our_bytes_specials_and_eog(tokenizer):
    ll = ll_tokenizer(tokenizer)
    assert ll is ll_tokenizer(tokenizer)  # cached
    assert ll.vocab_size == tokenizer.n_vocab
    assert ll.eos_tokens == eog_order(tokenizer)
    assert set(ll.eos_tokens) == set(tokenizer.eog_ids)
    rng = np.random.default_rng(0)
    ids = range(tokenizer.n_vocab) if tokenizer.n_vocab < 1000 else \
        rng.choice(tokenizer.n_vocab, 3000, replace=False).tolist() + sorted(tokenizer.eog_ids)
    for i in ids:
        piece = tokenizer.token_to_piece(i, special=True)
        special = bool(int(tokenizer.token_attr(i)) & int(PARSE_SPECIAL_ATTRS))
        # llguidance's special-token marker is a leading 0xFF, so the byte token 0xFF (never
        # in UTF-8 text) counts as special too, as it does in llama.cpp
        marked = special or piece[:1] == b"\xff"
        assert ll.is_special_token(i) == marked, i
        if not marked:
            assert ll.decode_bytes([i]) == piece, i


@pytest.mark.real
def test_bridge_builds_gemma_vocabulary_quickly(real_model):
    tokenizer = Tokenizer.from_metadata(GGUFFile(real_model(REAL["gemma3"])).metadata)
    started = time.perf_counter()
    ll = ll_tokenizer(tokenizer)  # a new Tokenizer object: not cached
    seconds = time.perf_counter() - started
    assert ll.vocab_size == 262144
    assert seconds < 10, f"building llguidance's tokenizer took {seconds:.1f} s"


# -- compiling -------------------------------------------------------------------------------

COMPILE_ERRORS = [
    ("gbnf", 'root ::= "a" foo', "Rule 'foo' not found"),
    ("gbnf", 'root := "a"', "Expected ::= at line 1"),
    ("gbnf", 'root ::= "a"\nx ::= [b-', "Unexpected end of input at line 2"),
    ("gbnf", 'root ::= "a"{2,1}', "range end must be >= start"),
    ("gbnf", 'item ::= "a"', "No 'root' rule found"),
    ("lark", 'start: "a" foo', 'line 1, column 8: unknown name: "foo"'),
    ("lark", 'start: /[a-/', "unclosed character class"),
    ("regex", "(?=a)b", "look-around, including look-ahead and look-behind, is not supported"),
    ("json_schema", '{"type": "string", "not": {"const": "x"}}', 'Unimplemented keys: ["not"]'),
    ("json_schema", '{"type": "array", "uniqueItems": true}', '["uniqueItems"]'),
    ("json_schema", '{"type": "obj"}', "Invalid type: obj"),
    ("json_schema", '{"$ref": "#/$defs/nowhere"}', "nowhere"),
]


@pytest.mark.parametrize("kind, text, why", COMPILE_ERRORS)
def test_compile_errors_are_one_line_and_say_why(tiny_tokenizer, kind, text, why):
    with pytest.raises(EdgeInferError) as info:
        compile_constraint(tiny_tokenizer, Constraint(kind, text))
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{kind} constraint: ")
    assert why in message


def test_constraint_arguments_are_checked():
    with pytest.raises(EdgeInferError, match="unknown constraint kind 'yaml'"):
        Constraint("yaml", "a: 1")
    with pytest.raises(EdgeInferError, match="must be a JSON object, not list"):
        Constraint.json_schema("[1]")
    with pytest.raises(EdgeInferError, match="not valid JSON"):
        Constraint.json_schema('{"type": ')
    assert Constraint.from_llama_grammar('%llguidance {}\nstart: "a"').kind == "lark"
    assert Constraint.from_llama_grammar('root ::= "a"').kind == "gbnf"


def test_compiled_constraints_are_cached_per_tokenizer(tiny_tokenizer, tmp_path):
    schema = Constraint.json_schema({"type": "integer"})
    first = compile_constraint(tiny_tokenizer, schema)
    assert compile_constraint(tiny_tokenizer, Constraint.json_schema('{"type":"integer"}')) \
        is not first  # a different text is a different key, even if the schema is equal
    assert compile_constraint(tiny_tokenizer, Constraint.json_schema({"type": "integer"})) \
        is first
    other = Tokenizer.from_metadata(GGUFFile(write_tiny_model(tmp_path / "o.gguf")).metadata,
                                    cache_dir=tmp_path)
    assert compile_constraint(other, schema) is not first


def test_unimplemented_keywords_compile_only_when_approximate(tiny_tokenizer):
    schema = Constraint.json_schema({"type": "array", "items": {"type": "integer"},
                                     "uniqueItems": True})
    with pytest.raises(EdgeInferError, match="uniqueItems"):
        compile_constraint(tiny_tokenizer, schema)
    compiled = compile_constraint(tiny_tokenizer, schema, approximate=True)
    assert not compiled.exact and any("uniqueItems" in w for w in compiled.warnings)
    assert accepts_with(tiny_tokenizer, compiled, "[1,1]")  # the ignored keyword, violated
    assert not accepts_with(tiny_tokenizer, compiled, '["a"]')  # the rest still holds


def accepts_with(tokenizer, compiled, text: str) -> bool:
    seq = compiled.start()
    return walk(tokenizer, seq, text) is None and ends_cleanly(tokenizer, seq)


def test_unknown_formats_are_annotations_and_known_ones_are_enforced(tiny_tokenizer):
    semver = compile_constraint(tiny_tokenizer, Constraint.json_schema(
        {"type": "string", "format": "semver"}))
    assert semver.exact and semver.warnings == ("Unknown format: semver",)
    assert accepts_with(tiny_tokenizer, semver, '"anything"')
    date = Constraint.json_schema({"type": "string", "format": "date"})
    assert accepts(tiny_tokenizer, date, '"2024-02-29"')
    assert not accepts(tiny_tokenizer, date, '"2024-13-01"')


# -- JSON schemas, token by token -------------------------------------------------------------

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.[a-z]{2,}$"},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "ü"]}, "maxItems": 2},
        "address": {"anyOf": [{"type": "null"},
                              {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}]},
    },
    "required": ["name", "age"],
}
INSTANCES = [  # (valid, instance), each label checked by jsonschema
    (True, {"name": "Zoë 🦊 東京 \"q\"\n\\ \u0001", "age": 42}),
    (True, {"name": "A", "age": 0, "email": "a@b.cd", "tags": ["ü", "a"],
            "address": {"city": "Paris"}}),
    (True, {"name": "B", "age": 150, "address": None, "extra": [1, {"x": 2.5e-3}]}),
    (False, {"name": "", "age": 3}),
    (False, {"name": "A", "age": 151}),
    (False, {"name": "A", "age": 1.5}),
    (False, {"name": "A"}),
    (False, {"name": "A", "age": 1, "email": "A@b.cd"}),
    (False, {"name": "A", "age": 1, "tags": ["a", "b", "a"]}),
    (False, {"name": "A", "age": 1, "tags": ["c"]}),
    (False, {"name": "A", "age": 1, "address": {"town": "x"}}),
    (False, ["name", "A"]),
]
SERIALIZATIONS = {
    "compact": {"separators": (",", ":"), "ensure_ascii": False},
    "default": {"ensure_ascii": False},
    "indented": {"indent": 2, "ensure_ascii": False},
}


def test_instance_labels_agree_with_jsonschema():
    validator = jsonschema.Draft202012Validator(PERSON)
    for valid, instance in INSTANCES:
        assert validator.is_valid(instance) == valid, instance


@pytest.mark.parametrize("style", SERIALIZATIONS)
def test_json_schema_instances_token_by_token(tokenizer, style):
    constraint = Constraint.json_schema(PERSON)
    for valid, instance in INSTANCES:
        text = json.dumps(instance, **SERIALIZATIONS[style])
        assert accepts(tokenizer, constraint, text) == valid, text


def test_unicode_escapes_in_free_strings_only(tokenizer):
    """json.dumps's default ASCII output: escapes, surrogate pairs too, are fine in free
    strings; a constant or enum value must be written as is (a documented limitation)."""
    free = Constraint.json_schema({"type": "string", "maxLength": 3})
    assert accepts(tokenizer, free, json.dumps("Zoë 🦊"[:3]))
    assert accepts(tokenizer, free, json.dumps("🦊"))  # "\\ud83e\\udd8a": one character
    assert not accepts(tokenizer, free, '"\\ud83e"')  # a lone surrogate is not Unicode
    assert not accepts(tokenizer, free, json.dumps("Zoë 🦊"))  # 5 characters
    enum = Constraint.json_schema({"enum": ["ü"]})
    assert accepts(tokenizer, enum, '"ü"')
    assert not accepts(tokenizer, enum, '"\\u00fc"')


def test_whitespace_is_llama_cpp_space_rule(tiny_tokenizer):
    """One space, or one or two newlines and up to 20 spaces or tabs, where JSON allows
    whitespace; none around the value."""
    schema = Constraint.json_schema({"type": "object"})
    assert accepts(tiny_tokenizer, schema, '{\n\n' + " " * 20 + '"a" : [ 1,\n\t2 ]\n}')
    for text in ['{\n\n\n"a":1}', '{\n' + " " * 21 + '"a":1}', '{"a":  1}', ' {"a":1}',
                 '{"a":1}\n', '{\r\n"a":1}']:
        assert not accepts(tiny_tokenizer, schema, text), text


def test_json_object_and_regex_kinds(tokenizer):
    assert accepts(tokenizer, Constraint("json_object"), '{"a": [1, {"b": null}]}')
    assert not accepts(tokenizer, Constraint("json_object"), "[1]")
    phone = Constraint("regex", r"\(\d{3}\) \d{3}-\d{4}")
    assert accepts(tokenizer, phone, "(555) 123-4567")
    assert not accepts(tokenizer, phone, "(555) 123-456")
    assert not accepts(tokenizer, phone, "(555) 123-45678")


# -- GBNF and Lark -----------------------------------------------------------------------------

GBNF_SAMPLES = {  # llama.cpp's grammars/, with a text each one derives
    "c": "int main(){int x = 3;while(x>0){x = x-1;}return x;}",
    "chess": "1. e4 e5\n2. Nf3 Nc6\n",
    "english": "Hello there, my friend.",
    "japanese": "こんにちは、世界。",
    "json": '{"a": [1, 2.5e3, "x\\n", true, null], "b": {}}',
    "json_arr": '[\n{"a": 1},\n{"b": [2]}]',
    "list": "- one\n- two\n",
    "arithmetic": None,  # see test_gbnf_terminals_are_matched_greedily
}


@pytest.mark.parametrize("name", sorted(GBNF_SAMPLES))
def test_llama_cpp_gbnf_grammars(tokenizer, name):
    grammar = Constraint("gbnf", gbnf(name))
    compiled = compile_constraint(tokenizer, grammar)
    if GBNF_SAMPLES[name] is not None:
        assert accepts_with(tokenizer, compiled, GBNF_SAMPLES[name])
        assert not accepts_with(tokenizer, compiled, GBNF_SAMPLES[name] + "\x01")


def test_gbnf_terminals_are_matched_greedily(tiny_tokenizer):
    """A documented limitation: llguidance's converter turns rules made only of literals and
    character classes into lexer terminals, matched greedily. arithmetic.gbnf's
    `num ::= [0-9]+ ws` with `ws ::= [ \\t\\n]*` then swallows the "\\n" that must follow,
    so "1 = 2\\n", which llama.cpp accepts, is refused. If this starts to pass, llguidance
    changed: update the docs in edgeinfer/structured/compile.py."""
    grammar = Constraint("gbnf", gbnf("arithmetic"))
    assert not accepts(tiny_tokenizer, grammar, "1 = 2\n")
    assert accepts(tiny_tokenizer, Constraint("gbnf", 'root ::= num "\\n"\nnum ::= [0-9]+'),
                   "12\n")


def test_lark_names_special_tokens(tiny_tokenizer):
    tk = tiny_tokenizer
    im_end = 2
    assert tk.token_text(im_end) == "<|im_end|>"
    seq = compile_constraint(tk, Constraint.from_llama_grammar(
        '%llguidance {}\nstart: "hi" <|im_end|> "!"')).start()
    assert walk(tk, seq, "hi") is None
    row = np.zeros(mask_words(tk.n_vocab), dtype=np.int32)
    seq.fill_mask(row)
    assert [t for t in range(tk.n_vocab) if mask_allows(row, t)] == [im_end]
    assert seq.accept(im_end) and walk(tk, seq, "!") is None and seq.is_accepting()
    # A literal spelling a special token is text: its text tokens, never the token.
    literal = compile_constraint(tk, Constraint("lark", 'start: "<|im_end|>"')).start()
    assert im_end not in literal.forced_tokens()
    assert walk(tk, literal, "<|im_end|>") is None and literal.is_accepting()


# -- per-sequence state ------------------------------------------------------------------------


def test_masks_agree_with_accept(tokenizer):
    """At every step of an instance: each allowed token (a sample) is accepted by a fork;
    each refused one is refused too, unless the grammar forces text here (then only its
    canonical tokenization is allowed, though other splits would be accepted)."""
    rng = np.random.default_rng(1)
    seq = compile_constraint(tokenizer, Constraint.json_schema(PERSON)).start()
    row = np.zeros(mask_words(tokenizer.n_vocab), dtype=np.int32)
    text = json.dumps(INSTANCES[1][1], ensure_ascii=False)
    for token in tokenizer.encode(text, add_special=False, parse_special=False):
        seq.fill_mask(row)
        allowed = np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little"))
        allowed = allowed[allowed < tokenizer.n_vocab]
        refused = np.setdiff1d(np.arange(tokenizer.n_vocab), allowed)
        for t in rng.choice(allowed, min(50, len(allowed)), replace=False):
            assert seq.fork().accept(int(t)), tokenizer.token_to_piece(int(t))
        if not seq.forced_tokens():
            for t in rng.choice(refused, min(50, len(refused)), replace=False):
                assert not seq.fork().accept(int(t)), tokenizer.token_to_piece(int(t))
        assert seq.accept(token)


def test_end_of_generation_only_where_accepting(tiny_tokenizer):
    tk = tiny_tokenizer
    number = compile_constraint(tk, Constraint.json_schema({"type": "integer"})).start()
    assert not ends_cleanly(tk, number)
    assert walk(tk, number, "12") is None
    assert ends_cleanly(tk, number) and not number.is_stopped()  # more digits may follow
    obj = compile_constraint(tk, Constraint.json_schema({"type": "object"})).start()
    assert walk(tk, obj, "{}") is None and obj.is_stopped()  # only the end can follow
    row = np.zeros(mask_words(tk.n_vocab), dtype=np.int32)
    obj.fill_mask(row)
    assert [t for t in range(tk.n_vocab) if mask_allows(row, t)] == sorted(tk.eog_ids)
    assert obj.accept(eog_order(tk)[0]) and obj.error is None


def test_a_refused_token_puts_the_matcher_in_error(tiny_tokenizer):
    tk = tiny_tokenizer
    seq = compile_constraint(tk, Constraint.json_schema({"type": "integer"})).start()
    assert not seq.accept(tk.encode("x", add_special=False)[0])
    assert seq.is_stopped() and "\n" not in seq.error and "doesn't satisfy" in seq.error


def test_rollback_restores_the_mask(tokenizer):
    seq = compile_constraint(tokenizer, Constraint.json_schema(PERSON)).start()
    before, after = (np.zeros(mask_words(tokenizer.n_vocab), dtype=np.int32) for _ in "ab")
    assert walk(tokenizer, seq, '{"name": "A", ') is None
    seq.fill_mask(before)
    tokens = tokenizer.encode('"age": 7', add_special=False, parse_special=False)
    assert seq.accept_tokens(tokens) == len(tokens)
    assert seq.rollback(len(tokens))
    seq.fill_mask(after)
    assert np.array_equal(before, after)


def test_mask_batch_matches_single_masks_and_applies_them(tokenizer):
    compiled = compile_constraint(tokenizer, Constraint.json_schema(PERSON))
    seqs = [compiled.start() for _ in range(3)]
    walk(tokenizer, seqs[1], '{"name": "A", "age": 1')
    walk(tokenizer, seqs[2], '{"name": "Zoë", "tags": [')
    batch = MaskBatch(4, tokenizer.n_vocab)
    batch.masks[:] = 0
    batch.fill([3, 0, 1], seqs)
    single = np.zeros(mask_words(tokenizer.n_vocab), dtype=np.int32)
    for row, seq in zip([3, 0, 1], seqs):
        seq.fill_mask(single)
        assert np.array_equal(batch.masks[row], single)
    n_logits = 32 * batch.masks.shape[1] + 7  # a model with more output rows than tokens
    logits = np.random.default_rng(2).standard_normal((3, n_logits)).astype(np.float32)
    expected = logits.copy()
    rows = np.array([3, -1, 1], dtype=np.int32)
    for j, row in enumerate(rows):
        if row >= 0:
            bits = np.unpackbits(batch.masks[row].view(np.uint8), bitorder="little")
            expected[j, np.flatnonzero(np.resize(bits, n_logits) == 0)] = -np.inf
            expected[j, bits.size:] = -np.inf
    batch.apply(logits, rows)
    assert np.array_equal(logits, expected)
    one = np.random.default_rng(3).standard_normal(tokenizer.n_vocab).astype(np.float32)
    copy = one.copy()
    seqs[0].apply(one)
    apply_bitmask(copy, batch.masks[3])
    assert np.array_equal(one, copy)
