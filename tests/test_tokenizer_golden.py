"""The tokenizer on the two real models against llama.cpp's own ids (shared/golden).

Skipped when the models are not pulled; `real_model` comes from conftest.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgeinfer.gguf_file import GGUFFile
from edgeinfer.tokenizer import Tokenizer

pytestmark = pytest.mark.real

GOLDEN = Path(__file__).resolve().parents[2] / "shared" / "golden"
MODELS = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
}
PLAIN_TEXTS = [
    "Hello world",
    " leading space and trailing space ",
    "Tabs\tand\nnewlines\n\n\n  indented",
    "naïve café résumé — ½ ≠ ¼",
    "日本語のテキスト、中文分词测试。한국어",
    "emoji 🤖🚀👍🏽 zwj 😶‍🌫️ flags 🇫🇷",
    "code: def f(x):\n    return x ** 2  # square\n",
    "I'm sure it's they're we'll, 3.14159 and 1,000,000!",
]


def _golden_cases(name: str) -> list[dict]:
    path = GOLDEN / f"{name}.json"
    if not path.exists():
        return []
    return json.loads(path.read_text(encoding="utf-8"))["tokenize"]


@pytest.fixture(scope="module")
def tokenizers_by_name(real_model, tmp_path_factory) -> dict:
    """Both real tokenizers, built once per module into a fresh cache (a cold build)."""
    cache = tmp_path_factory.mktemp("tokenizer-cache")
    built = {}
    for name, filename in MODELS.items():
        meta = GGUFFile(real_model(filename)).metadata
        built[name] = Tokenizer.from_metadata(meta, cache_dir=cache)
    return built


@pytest.fixture(params=list(MODELS))
def tok(request, tokenizers_by_name) -> Tokenizer:
    return tokenizers_by_name[request.param]


@pytest.mark.parametrize("name", list(MODELS))
def test_golden_tokenize_matches_llama_cpp(name, tokenizers_by_name):
    cases = _golden_cases(name)
    if not cases:
        pytest.skip(f"no golden data for {name}")
    tk = tokenizers_by_name[name]
    mismatches = [
        (c["text"], c["add_special"], c["parse_special"])
        for c in cases
        if tk.encode(c["text"], c["add_special"], c["parse_special"]) != c["ids"]
    ]
    assert mismatches == []


@pytest.mark.parametrize("name", list(MODELS))
def test_golden_add_bos_flag(name, tokenizers_by_name):
    path = GOLDEN / f"{name}.json"
    if not path.exists():
        pytest.skip(f"no golden data for {name}")
    assert tokenizers_by_name[name].add_bos == json.loads(path.read_text())["add_bos"]


@pytest.mark.parametrize("text", PLAIN_TEXTS)
def test_round_trip(tok, text):
    assert tok.decode(tok.encode(text, add_special=False)) == text
    # BOS is a control token: hidden unless special is asked for.
    assert tok.decode(tok.encode(text, add_special=True)) == text


@pytest.mark.parametrize("text", PLAIN_TEXTS)
def test_stream_decode_equals_full_decode(tok, text):
    ids = tok.encode(text, add_special=False)
    stream = tok.stream_decoder()
    chunks = [stream.feed(t) for t in ids]
    chunks.append(stream.flush())
    assert "".join(chunks) == tok.decode(ids)
    assert not any("\ufffd" in c for c in chunks)


def test_stream_holds_back_partial_characters(tok):
    """An emoji outside the vocabulary arrives as several byte(-level) tokens: the decoder
    returns nothing until the character is complete."""
    ids = tok.encode("🦙", add_special=False)
    assert len(ids) > 1
    stream = tok.stream_decoder()
    assert [stream.feed(t) for t in ids] == [""] * (len(ids) - 1) + ["🦙"]
    assert stream.flush() == ""


def test_stream_flush_replaces_a_truncated_character(tok):
    ids = tok.encode("🦙", add_special=False)
    stream = tok.stream_decoder()
    assert stream.feed(ids[0]) == ""
    assert stream.flush() == "\ufffd"


def test_smollm_special_tokens(tokenizers_by_name):
    tk = tokenizers_by_name["smollm2"]
    im_start, im_end = 1, 2
    assert tk.token_text(im_start) == "<|im_start|>"
    ids = tk.encode("<|im_start|>user\nHi<|im_end|>", add_special=False, parse_special=True)
    assert ids[0] == im_start and ids[-1] == im_end
    plain = tk.encode("<|im_start|>user", add_special=False, parse_special=False)
    assert im_start not in plain
    assert tk.decode(plain) == "<|im_start|>user"
    assert tk.decode(ids) == "user\nHi"  # control tokens hidden
    assert tk.decode(ids, special=True) == "<|im_start|>user\nHi<|im_end|>"
    assert tk.token_to_piece(im_end) == b""
    assert tk.token_to_piece(im_end, special=True) == b"<|im_end|>"
    assert tk.bos_id == 1 and tk.eos_id == 2 and not tk.add_bos
    # EOS plus every text llama.cpp treats as end of generation (<reponame> is FIM_REP).
    assert tk.eog_ids == {0, 2, 4}
    assert tk.is_eog(im_end) and not tk.is_eog(im_start)


def test_gemma_special_tokens(tokenizers_by_name):
    tk = tokenizers_by_name["gemma3"]
    start = tk.encode("<start_of_turn>", add_special=False)
    assert len(start) == 1 and tk.token_text(start[0]) == "<start_of_turn>"
    text = "<start_of_turn>user\nHi<end_of_turn>"
    ids = tk.encode(text, add_special=True)
    assert ids[0] == tk.bos_id == 2 and tk.add_bos
    assert start[0] not in tk.encode(text, add_special=False, parse_special=False)
    end = tk.encode("<end_of_turn>", add_special=False)[0]
    assert tk.is_eog(end) and tk.is_eog(tk.eos_id)
    assert tk.decode(ids) == "user\nHi"
    assert tk.decode(ids, special=True) == "<bos>" + text
    # User-defined tokens (here the tab) are split out even without special parsing.
    tab = tk.encode("\t", add_special=False, parse_special=False)
    assert len(tab) == 1 and tk.token_text(tab[0]) == "\t"


def test_gemma_byte_fallback_pieces(tokenizers_by_name):
    tk = tokenizers_by_name["gemma3"]
    ids = tk.encode("🦙", add_special=False)
    assert [tk.token_text(t) for t in ids] == ["<0xF0>", "<0x9F>", "<0xA6>", "<0x99>"]
    assert b"".join(tk.token_to_piece(t) for t in ids) == "🦙".encode()


def test_warm_build_reads_the_cache(real_model, tmp_path, monkeypatch):
    """The second build must not derive the merges again and must give the same ids."""
    import edgeinfer.tokenizer as tokenizer_module

    meta = GGUFFile(real_model(MODELS["smollm2"])).metadata
    cold = Tokenizer.from_metadata(meta, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.npy"))) == 1

    def fail(vocab):
        raise AssertionError("merge table rebuilt despite the cache")

    monkeypatch.setattr(tokenizer_module, "_bpe_merge_table", fail)
    warm = Tokenizer.from_metadata(meta, cache_dir=tmp_path)
    text = "Caching must not change a single id: 日本語 🦙 <|im_start|>"
    assert warm.encode(text) == cold.encode(text)
