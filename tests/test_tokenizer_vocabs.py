"""llama.cpp's tokenizer conformance data, plus edge cases on tiny vocab-only GGUF files.

The conformance files (`ggml-vocab-*.gguf` with `.inp`/`.out`) come from the llama-cpp-python
0.3.36 sdist via `python scripts/fetch_vocab_tests.py`; those tests skip when they are absent.
llama.cpp's tests/test-tokenizer-0.cpp reads them the same way: inputs are separated by a
`__ggml_vocab_test__` line, `.out` holds one line of ids per input, and every input is
tokenized with add_special=false, parse_special=false.
"""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np
import pytest

from edgeinfer.errors import EdgeInferError
from edgeinfer.gguf_file import GGUFFile
from edgeinfer.tokenizer import Tokenizer

# Vocab types we claim; each must pass every case. Not claimed: bert-bge (WPM) and
# nomic-bert-moe (t5/UGM), which are other tokenizer models; aquila, baichuan and gpt-neox
# ship no .inp/.out here.
CLAIMED_VOCABS = [
    "llama-spm",
    "phi-3",
    "llama-bpe",
    "qwen2",
    "qwen35",
    "gpt-2",
    "starcoder",
    "falcon",
    "deepseek-llm",
    "deepseek-coder",
    "command-r",
    "refact",
    "mpt",
    "gemma-4",
]
SEPARATOR = "\n__ggml_vocab_test__\n"


def _vocab_tests_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgeinfer" / "vocab-tests"


def _read_cases(gguf_path: Path) -> list[tuple[str, list[int]]]:
    raw = gguf_path.with_name(gguf_path.name + ".inp").read_bytes().decode("utf-8")
    inputs, pos = [], 0
    while pos < len(raw):  # like read_tests(): a trailing separator adds no empty case
        end = raw.find(SEPARATOR, pos)
        if end < 0:
            inputs.append(raw[pos:])
            break
        inputs.append(raw[pos:end])
        pos = end + len(SEPARATOR)
    lines = gguf_path.with_name(gguf_path.name + ".out").read_text(encoding="utf-8").split("\n")
    return [(text, [int(t) for t in line.split()]) for text, line in zip(inputs, lines)]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tokenizer-cache")


@pytest.mark.parametrize("name", CLAIMED_VOCABS)
def test_llama_cpp_vocab_conformance(name, cache_dir):
    path = _vocab_tests_dir() / f"ggml-vocab-{name}.gguf"
    if not path.with_name(path.name + ".out").exists():
        pytest.skip("conformance data absent (run scripts/fetch_vocab_tests.py)")
    tk = Tokenizer.from_metadata(GGUFFile(path).metadata, cache_dir=cache_dir)
    cases = _read_cases(path)
    assert len(cases) >= 40
    failures = [(text, ids) for text, ids in cases if tk.encode(text, False, False) != ids]
    assert failures == []


# ---------------------------------------------------------------------------------------------
# Tiny vocab-only GGUF fixtures
# ---------------------------------------------------------------------------------------------

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6


def _byte_level_alphabet() -> list[str]:
    """GPT-2's bytes_to_unicode characters, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra, out = 0, []
    for b in range(256):
        if b in printable:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def _write_vocab(path: Path, model: str, tokens, types, **kv) -> dict:
    """Write a vocab-only GGUF and read its metadata back through GGUFFile."""
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_tokenizer_model(model)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    for key, value in kv.items():
        if key == "merges":
            writer.add_token_merges(value)
        elif key == "scores":
            writer.add_token_scores(value)
        elif isinstance(value, bool):
            writer.add_bool(f"tokenizer.ggml.{key}", value)
        elif isinstance(value, int):
            writer.add_uint32(f"tokenizer.ggml.{key}", value)
        else:
            writer.add_string(key if "." in key else f"tokenizer.ggml.{key}", value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return GGUFFile(path).metadata


def _bpe_meta(tmp_path: Path, extra: list[tuple[str, int]] = (), **kv) -> dict:
    """A byte-level vocab: the 256 byte characters, "Ġt", "he", plus `extra` tokens."""
    tokens = [*_byte_level_alphabet(), "\u0120t", "he", *(t for t, _ in extra)]
    types = [NORMAL] * 258 + [ty for _, ty in extra]
    kv.setdefault("pre", "gpt-2")
    return _write_vocab(
        tmp_path / "bpe.gguf", "gpt2", tokens, types, merges=["\u0120 t", "h e"], **kv
    )


def _spm_meta(tmp_path: Path, **kv) -> dict:
    """A SentencePiece vocab: unk, bos, eos, 256 byte tokens, then scored pieces."""
    pieces = {"\u2581": -1.0, "a": -2.0, "b": -3.0, "ab": -4.0, "\u2581ab": -5.0, "<tag>": 0.0}
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *pieces]
    types = [UNKNOWN, CONTROL, CONTROL, *[BYTE] * 256, *[NORMAL] * 5, USER_DEFINED]
    scores = [0.0] * 259 + list(pieces.values())
    return _write_vocab(tmp_path / "spm.gguf", "llama", tokens, types, scores=scores, **kv)


def _ids(tk: Tokenizer, *texts: str) -> list[int]:
    return [tk.encode(t, add_special=False)[0] for t in texts]


def test_special_partition_is_longest_first(tmp_path):
    """llama.cpp splits out longer special tokens first over the whole text: with "ab" and
    "bcd", "abcd" gives a + bcd (HF's leftmost-longest would give ab + c + d)."""
    meta = _bpe_meta(tmp_path, [("ab", USER_DEFINED), ("bcd", USER_DEFINED)])
    tk = Tokenizer.from_metadata(meta, cache_dir=tmp_path)
    a, bcd = tk.encode("a", False)[0], tk.n_vocab - 1
    assert tk.encode("abcd", add_special=False) == [a, bcd]
    # User-defined tokens are split out even without special parsing.
    assert tk.encode("abcd", add_special=False, parse_special=False) == [a, bcd]


def test_parse_special_controls_control_tokens(tmp_path):
    meta = _bpe_meta(tmp_path, [("<|x|>", CONTROL)])
    tk = Tokenizer.from_metadata(meta, cache_dir=tmp_path)
    x = tk.n_vocab - 1
    assert tk.encode("<|x|>", add_special=False, parse_special=True) == [x]
    as_text = tk.encode("<|x|>", add_special=False, parse_special=False)
    assert x not in as_text and tk.decode(as_text) == "<|x|>"
    assert tk.decode([x]) == "" and tk.decode([x], special=True) == "<|x|>"


def test_eog_text_fixup_makes_a_normal_token_control(tmp_path):
    meta = _bpe_meta(tmp_path, [("<|im_end|>", NORMAL)])
    tk = Tokenizer.from_metadata(meta, cache_dir=tmp_path)
    im_end = tk.n_vocab - 1
    assert tk.is_eog(im_end) and tk.is_control(im_end)
    assert tk.encode("<|im_end|>", add_special=False) == [im_end]
    assert tk.token_to_piece(im_end) == b""


def test_phi3_rstrip_is_ascii_only(tmp_path):
    """Phi-3 models get RSTRIP on special tokens: C isspace() only, so NBSP stays."""
    meta = _bpe_meta(tmp_path, [("<|end|>", CONTROL)], **{"general.name": "Phi-3 mini"})
    tk = Tokenizer.from_metadata(meta, cache_dir=tmp_path)
    end = tk.n_vocab - 1
    assert tk.encode("<|end|> \t\nhe", add_special=False) == [end, *_ids(tk, "he")]
    with_nbsp = tk.encode("<|end|>\u00a0he", add_special=False)
    assert with_nbsp[0] == end and tk.decode(with_nbsp[1:]) == "\u00a0he"


def test_bos_eos_rules(tmp_path):
    bos_eos = {"bos_token_id": 1, "eos_token_id": 2}
    assert not Tokenizer.from_metadata(_bpe_meta(tmp_path, **bos_eos), tmp_path).add_bos
    llama3 = Tokenizer.from_metadata(_bpe_meta(tmp_path, pre="llama-bpe", **bos_eos), tmp_path)
    assert llama3.add_bos and llama3.encode("he")[0] == 1
    off = _bpe_meta(tmp_path, pre="llama-bpe", add_bos_token=False, add_eos_token=True, **bos_eos)
    tk = Tokenizer.from_metadata(off, tmp_path)
    assert tk.encode("he") == [*_ids(tk, "he"), 2]
    assert tk.encode("he", add_special=False) == _ids(tk, "he")
    # BPE defaults to id 11 for BOS/EOS when the GGUF names none, as llama.cpp does.
    assert Tokenizer.from_metadata(_bpe_meta(tmp_path), tmp_path).bos_id == 11


def test_missing_pre_means_default_and_unknown_pre_is_refused(tmp_path):
    meta = _bpe_meta(tmp_path)
    del meta["tokenizer.ggml.pre"]
    assert Tokenizer.from_metadata(meta, tmp_path).pre == "default"
    with pytest.raises(EdgeInferError, match="'no-such-pre'.*llama-bpe"):
        Tokenizer.from_metadata(_bpe_meta(tmp_path, pre="no-such-pre"), tmp_path)


def test_unknown_tokenizer_model_is_refused(tmp_path):
    meta = _write_vocab(tmp_path / "t5.gguf", "t5", ["<pad>", "</s>"], [CONTROL, CONTROL])
    with pytest.raises(EdgeInferError, match="'t5'.*gpt2"):
        Tokenizer.from_metadata(meta, tmp_path)


def test_duplicate_tokens_are_refused(tmp_path):
    meta = _bpe_meta(tmp_path, [("he", NORMAL)])
    with pytest.raises(EdgeInferError, match="duplicate token 'he'"):
        Tokenizer.from_metadata(meta, tmp_path)


def test_spm_space_prefix_after_every_special_token(tmp_path):
    tk = Tokenizer.from_metadata(_spm_meta(tmp_path), tmp_path)
    bos, tag = 1, tk.n_vocab - 1
    space_ab = tk.n_vocab - 2
    assert tk.add_bos and tk.bos_id == bos and tk.eos_id == 2
    assert tk.encode("ab") == [bos, space_ab]
    assert tk.encode("<s>ab", add_special=False) == [bos, space_ab]
    assert tk.encode("ab<tag>ab", add_special=False) == [space_ab, tag, space_ab]
    assert tk.encode("") == [bos] and tk.encode("", add_special=False) == []
    # detokenize drops the prefix space of the first piece only when it is the first token.
    assert tk.decode([space_ab]) == "ab"
    assert tk.decode([bos, space_ab]) == " ab"


def test_spm_without_space_prefix_and_byte_fallback(tmp_path):
    tk = Tokenizer.from_metadata(_spm_meta(tmp_path, add_space_prefix=False), tmp_path)
    ab = tk.n_vocab - 3
    assert tk.encode("ab", add_special=False) == [ab]
    ids = tk.encode("é", add_special=False)
    assert [tk.token_text(t) for t in ids] == ["<0xC3>", "<0xA9>"]
    stream = tk.stream_decoder()
    assert [stream.feed(t) for t in ids] == ["", "é"]


def test_spm_merge_order_is_llama_cpps(tmp_path):
    """Cases a BPE emulation gets wrong: equal scores merge the leftmost pair first, a
    character that is not a token still merges into one that is, and the best-scoring pair
    wins wherever it is."""
    pieces = {"a": -1.0, "b": -1.0, "c": -1.0, "ab": -5.0, "bc": -5.0, "xa": -3.0, "bcd": -2.0,
              "de": -5.0, "ef": -1.0}
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *pieces]
    types = [UNKNOWN, CONTROL, CONTROL, *[BYTE] * 256, *[NORMAL] * len(pieces)]
    scores = [0.0] * 259 + list(pieces.values())
    meta = _write_vocab(tmp_path / "spm.gguf", "llama", tokens, types, scores=scores,
                        add_space_prefix=False)
    tk = Tokenizer.from_metadata(meta, tmp_path)

    def texts(text):
        return [tk.token_text(t) for t in tk.encode(text, add_special=False)]

    assert texts("abc") == ["ab", "c"]  # ab and bc tie: the left one
    assert texts("xab") == ["xa", "b"]  # "x" is no token, yet x+a forms one
    assert texts("xy") == ["<0x78>", "<0x79>"]
    assert texts("abcd") == ["ab", "c", "<0x64>"]  # "cd" is no token: bcd never forms
    assert texts("def") == ["<0x64>", "ef"]  # the better pair on the right goes first
    assert texts("ab\u2581def") == ["ab", "<0xE2>", "<0x96>", "<0x81>", "<0x64>", "ef"]


def test_spm_without_byte_tokens_falls_back_to_unk(tmp_path):
    """llama.cpp's byte_to_token throws there; a prompt should not crash a server."""
    tokens, types = ["<s>", "<unk>", "a", "b"], [CONTROL, UNKNOWN, NORMAL, NORMAL]
    meta = _write_vocab(tmp_path / "unk.gguf", "llama", tokens, types, scores=[0.0] * 4,
                        add_space_prefix=False, unknown_token_id=1)
    tk = Tokenizer.from_metadata(meta, tmp_path)
    assert tk.encode("aéb", add_special=False) == [2, 1, 1, 3]  # é: two bytes, no tokens


@pytest.mark.parametrize("meta", ["spm", "bpe"])
def test_text_with_lone_surrogates_is_refused(tmp_path, meta):
    tk = Tokenizer.from_metadata((_spm_meta if meta == "spm" else _bpe_meta)(tmp_path), tmp_path)
    with pytest.raises(EdgeInferError, match="not valid UTF-8"):
        tk.encode("ab\udcffc")


def test_bpe_clean_spaces_on_full_decode_only(tmp_path):
    """gpt-2 style vocabs clean " ," and " 's" on a full decode but not when streaming."""
    tk = Tokenizer.from_metadata(_bpe_meta(tmp_path), tmp_path)
    text = "he , he 's he ' he"
    ids = tk.encode(text, add_special=False)
    assert tk.decode(ids) == "he, he's he'he"
    stream = tk.stream_decoder()
    assert "".join(stream.feed(t) for t in ids) + stream.flush() == text


def test_token_ids_outside_the_vocab_are_refused(tmp_path):
    tk = Tokenizer.from_metadata(_bpe_meta(tmp_path), tmp_path)
    with pytest.raises(EdgeInferError, match="outside the vocabulary"):
        tk.decode([tk.n_vocab])


def test_cache_survives_a_damaged_file(tmp_path):
    meta = _bpe_meta(tmp_path)
    first = Tokenizer.from_metadata(meta, cache_dir=tmp_path / "cache")
    (cached,) = (tmp_path / "cache").glob("*.npy")
    cached.write_bytes(b"not a numpy file")
    again = Tokenizer.from_metadata(meta, cache_dir=tmp_path / "cache")
    assert again.encode("the hehe t") == first.encode("the hehe t")
    assert len(first.encode("the hehe t")) < len("the hehe t")  # the merges are in use
    assert np.load(cached).shape[1] == 3  # rewritten
