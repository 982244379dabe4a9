"""Tokenizer that reproduces llama.cpp's token ids from GGUF metadata.

llama.cpp (`src/llama-vocab.cpp`) tokenizes in two stages, and so do we:

1. **Special-token partition** (`tokenizer_st_partition`), done here in Python: every CONTROL,
   UNKNOWN and USER_DEFINED token is searched in the raw text, longest (in UTF-8 bytes) first,
   and split out. With `parse_special=False` CONTROL/UNKNOWN tokens are left as text but
   USER_DEFINED ones are still split out. HF `tokenizers` matches added tokens leftmost-longest
   instead, which differs for overlapping tokens, so we never give it added tokens.
2. **Each remaining text fragment** is tokenized by the vocabulary's own algorithm:
   * `llama` (SentencePiece) vocabularies: llama.cpp's merge loop itself (`SpmEncoder`), in
     Python: repeatedly join the adjacent pair whose concatenation is the best-scoring token;
     spaces become `▁`, and a `' '` is prepended to every fragment that starts the text or
     follows a special token when `add_space_prefix`. A `tokenizers` BPE can only emulate
     it (ties and non-token characters differ) and holds ~80 MB for Gemma 3's 262k tokens;
   * `gpt2` vocabularies: an HF `tokenizers.Tokenizer`, byte-level BPE, the pre-tokenizer
     being llama.cpp's regex list for `tokenizer.ggml.pre` (`tokenizer_tables.PRE_TYPES`) as
     `Split(..., "isolated")` steps;
   * `gemma4`: an HF BPE over raw UTF-8 with `▁` spaces, split at newline runs.

The BPE merge table (token-id triples) is cached (`.npy`) under `cache_dir`, keyed by a hash of
everything it is built from. Detokenization uses per-id byte pieces with llama.cpp's
`token_to_piece` rules, built lazily, never HF decoders (they differ on control, unknown and
user-defined tokens). The facts behind these rules: docs/tokenizer.md.
"""

from __future__ import annotations

import codecs
import hashlib
import heapq
import os
import re
import tempfile
from array import array
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

import numpy as np
import tokenizers
from tokenizers import Regex, models, pre_tokenizers

from edgeinfer.errors import EdgeInferError
from edgeinfer.tokenizer_tables import (
    PARSE_SPECIAL_ATTRS,
    PRE_REGEXES,
    SPECIAL_CACHE_ATTRS,
    Attr,
    Vocab,
    read_vocab,
)

# Bump when the cached table's meaning changes (how the BPE merges are derived).
_CACHE_FORMAT = "edgeinfer-merges-2"
_SPACE_MARK = "\u2581"  # SentencePiece's "▁"
_C_ISSPACE = " \t\n\v\f\r"  # llama.cpp strips with C isspace(), which is ASCII only
_NEWLINE_RUNS = re.compile(r"[^\n]+|\n+")


# ---------------------------------------------------------------------------------------------
# SentencePiece vocabularies: llama.cpp's algorithm
# ---------------------------------------------------------------------------------------------


class SpmEncoder:
    """`llm_tokenizer_spm_session::tokenize`: start from the text's characters, keep merging
    the adjacent pair whose concatenation is a token with the highest score (ties: leftmost),
    then emit each symbol's id, or its UTF-8 bytes as `<0xXX>` tokens if it is not a token.

    Sizes are counted in characters where llama.cpp counts bytes; they only serve to tell a
    queued pair whose sides have grown since, which either count does. The text must be valid
    UTF-8 (no lone surrogates), where characters and llama.cpp's symbols are the same.

    Speed: a merge never crosses a point where no token could: before a `▁` that follows a
    character c unless some token holds c + `▁` (Gemma 3: only `>▁</`). So the text is cut
    there into words, which are merged separately (the same merges, llama.cpp's order within
    each word) and remembered, as HF tokenizers cache words."""

    CACHE_WORDS = 16384
    CACHE_CHARS = 64

    def __init__(self, vocab: Vocab):
        self._index = vocab.index
        self._score = array("f", vocab.scores.astype(np.float32).tobytes())  # floats on read
        self._unk = vocab.ids.get("unk")
        joined = {t[i - 1] for t in vocab.tokens if t.find(_SPACE_MARK, 1) > 0
                  for i in range(1, len(t)) if t[i] == _SPACE_MARK}
        keep = "".join(re.escape(c) for c in sorted(joined | {_SPACE_MARK}))
        self._cuts = re.compile(f"(?<=[^{keep}])(?={_SPACE_MARK})")
        self._words: dict[str, tuple[int, ...]] = {}

    def encode(self, text: str, out: list[int]) -> None:
        words = self._words
        for word in self._cuts.split(text):
            ids = words.get(word)
            if ids is None:
                ids = self._merge(word)
                if len(word) <= self.CACHE_CHARS:  # a long run without spaces: not again
                    if len(words) >= self.CACHE_WORDS:
                        words.clear()
                    words[word] = ids
            out += ids

    def _merge(self, text: str) -> tuple[int, ...]:
        index, score = self._index, self._score
        push, pop = heapq.heappush, heapq.heappop
        syms = list(text)
        n = len(syms)
        nxt = [*range(1, n), -1]
        prv = list(range(-1, n - 1))
        heap = []
        for i, tid in enumerate(map(index.get, map(str.__add__, syms, syms[1:]))):
            if tid is not None:
                heap.append((-score[tid], i, i + 1, 2))
        heapq.heapify(heap)
        while heap:
            _, left, right, size = pop(heap)
            a, b = syms[left], syms[right]
            if not a or not b or len(a) + len(b) != size:
                continue  # a side has been merged since this pair was queued
            merged = syms[left] = a + b
            syms[right] = ""
            nxt[left] = after = nxt[right]
            if after >= 0:
                prv[after] = left
                pair = merged + syms[after]
                tid = index.get(pair)
                if tid is not None:
                    push(heap, (-score[tid], left, after, len(pair)))
            before = prv[left]
            if before >= 0:
                pair = syms[before] + merged
                tid = index.get(pair)
                if tid is not None:
                    push(heap, (-score[tid], before, left, len(pair)))
        ids = []
        for sym in syms:
            if sym:
                tid = index.get(sym)
                ids.extend((tid,) if tid is not None else self._bytes(sym))
        return tuple(ids)

    def _bytes(self, sym: str) -> list[int]:
        """`byte_to_token`: `<0xXX>`, else the byte itself as a token; llama.cpp throws if
        neither exists, we fall back to the unknown token."""
        ids = []
        for byte in sym.encode("utf-8", "surrogateescape"):
            tid = self._index.get(f"<0x{byte:02X}>")
            if tid is None:
                tid = self._index.get(bytes([byte]).decode("utf-8", "surrogateescape"))
            if tid is None:
                tid = self._unk
            if tid is None:
                raise EdgeInferError(f"the vocabulary has no token for byte 0x{byte:02X}")
            ids.append(tid)
        return ids


# ---------------------------------------------------------------------------------------------
# BPE vocabularies: HF tokenizers.Tokenizer (cached merge table)
# ---------------------------------------------------------------------------------------------


def _hf_vocab(vocab: Vocab) -> dict[str, int]:
    # Tokens that are not valid UTF-8 (kept as surrogate escapes) cannot enter Rust strings, and
    # no valid input text can produce them either. One join checks the common all-valid case.
    if not _has_surrogate("".join(vocab.tokens)):
        return vocab.index
    return {t: i for t, i in vocab.index.items() if not _has_surrogate(t)}


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _bpe_merge_table(vocab: Vocab) -> np.ndarray:
    """(n_merges, 3) [left, right, result] ids in GGUF order. Merges split at the first space
    at index >= 1 like llama.cpp; those naming missing tokens are dropped (HF rejects them) and
    the first of duplicates wins, as in llama.cpp's `bpe_ranks.emplace`."""
    hf_vocab = _hf_vocab(vocab)
    rows = []
    seen: set[tuple[int, int]] = set()
    for merge in vocab.merges:
        k = merge.find(" ", 1)
        if k < 0:
            continue
        a, b = merge[:k], merge[k + 1 :]
        ids = (hf_vocab.get(a), hf_vocab.get(b), hf_vocab.get(a + b))
        if None in ids or ids[:2] in seen:
            continue
        seen.add(ids[:2])
        rows.append(ids)
    return np.asarray(rows, dtype=np.int32).reshape(-1, 3)


def _build_hf(vocab: Vocab, table: np.ndarray) -> tokenizers.Tokenizer:
    tokens = vocab.tokens
    pairs = list(zip(_lookup(tokens, table[:, 0]), _lookup(tokens, table[:, 1])))
    hf_vocab = _hf_vocab(vocab)
    if vocab.kind == "raw_bpe":
        return tokenizers.Tokenizer(models.BPE(hf_vocab, pairs, byte_fallback=True))
    model = models.BPE(hf_vocab, pairs, ignore_merges=vocab.spec.ignore_merges)
    tk = tokenizers.Tokenizer(model)
    splits = [
        pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_REGEXES[vocab.spec.regexes]
    ]
    byte_level = pre_tokenizers.ByteLevel(
        add_prefix_space=False, trim_offsets=False, use_regex=False
    )
    tk.pre_tokenizer = pre_tokenizers.Sequence([*splits, byte_level])
    return tk


def _lookup(tokens: list[str], ids: np.ndarray) -> list[str]:
    return list(map(tokens.__getitem__, ids.tolist()))


def _cache_key(vocab: Vocab) -> str:
    h = hashlib.sha256()
    header = [_CACHE_FORMAT, vocab.kind]
    h.update("\0".join(header).encode())
    h.update(str(len(vocab.tokens)).encode())
    h.update("\0".join(vocab.tokens).encode("utf-8", "surrogateescape"))
    if vocab.scores is not None:
        h.update(np.ascontiguousarray(vocab.scores, dtype="<f4").tobytes())
    if vocab.merges is not None:
        h.update("\0".join(vocab.merges).encode("utf-8", "surrogateescape"))
    return h.hexdigest()[:32]


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/edgeinfer/tokenizers`, else `~/.cache/edgeinfer/tokenizers`."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgeinfer" / "tokenizers"


def _load_or_build(vocab: Vocab, cache_dir: Path) -> tokenizers.Tokenizer:
    """The merge table is what costs seconds to derive, so it is what we cache (as `.npy` of
    token ids). Caching `Tokenizer.to_str()` instead would be slower: `from_str` takes over a
    second to parse Gemma 3's JSON, more than building the model from the table."""
    path = cache_dir / f"{_cache_key(vocab)}.npy"
    table = _read_table(path, len(vocab.tokens))
    if table is None:
        table = _bpe_merge_table(vocab)
        _write_table(path, table)
    return _build_hf(vocab, table)


def _read_table(path: Path, n_vocab: int) -> np.ndarray | None:
    try:
        table = np.load(path, allow_pickle=False)
    except (OSError, ValueError):
        return None  # absent or damaged: rebuild
    ok = table.ndim == 2 and table.shape[1] == 3 and table.dtype == np.int32
    if not ok or (table.size and (table.min() < 0 or table.max() >= n_vocab)):
        return None
    return table


def _write_table(path: Path, table: np.ndarray) -> None:
    # A cache is an optimisation: an unwritable directory must not stop the model loading.
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".npy")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, table, allow_pickle=False)
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# Detokenization helpers
# ---------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _byte_level_decoder() -> dict[str, int]:
    """Inverse of GPT-2's `bytes_to_unicode` (llama.cpp `unicode_utf8_to_byte`)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    mapping = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            mapping[chr(256 + extra)] = b
            extra += 1
    return mapping


def _byte_level_bytes(text: str) -> bytes:
    inverse = _byte_level_decoder()
    try:
        return bytes(inverse[c] for c in text)
    except KeyError:
        pass
    # llama_decode_text: a character outside the byte alphabet becomes a marker that (oddly)
    # repeats the whole token text.
    out = bytearray()
    for c in text:
        if c in inverse:
            out.append(inverse[c])
        else:
            hexes = c.encode("utf-8", "surrogateescape").hex()
            out += f"[UNK_BYTE_0x{hexes}{text}]".encode("utf-8", "surrogateescape")
    return bytes(out)


def _byte_token_value(text: str) -> int:
    """`strtol(text.substr(3, 2), 16)` for a `<0xXX>` byte token."""
    digits = ""
    for c in text[3:5]:
        if c not in "0123456789abcdefABCDEF":
            break
        digits += c
    return int(digits, 16) if digits else 0


def _clean_spaces(data: bytes) -> bytes:
    """detokenize's clean-up passes, byte for byte as llama.cpp does them in place."""
    out = _clean_punctuation(data)
    out = _clean_lone_apostrophes(out)
    return _clean_contractions(out)


def _clean_punctuation(text: bytes) -> bytes:
    out = bytearray(text[:1])
    for i in range(1, len(text)):
        if text[i - 1] == 0x20 and text[i] in b"?!.,":
            out.pop()  # drop the space before " ?", " !", " .", " ,"
        out.append(text[i])
    return bytes(out)


def _clean_lone_apostrophes(text: bytes) -> bytes:
    buf = bytearray(text)
    out = bytearray(buf[:1])
    i = 1
    while i < len(buf):
        x = buf[i]
        if x == 0x27 and i + 1 < len(buf) and buf[i - 1] == 0x20 and buf[i + 1] == 0x20:
            out.pop()  # " ' " -> "'": llama.cpp also zeroes the next space and skips it
            i += 1
            buf[i] = 0
        out.append(x)
        i += 1
    return bytes(out)


def _clean_contractions(text: bytes) -> bytes:
    out = bytearray(text[:1])
    n = len(text)
    for i in range(1, n):
        x = text[i]
        if text[i - 1] == 0x20 and x == 0x27 and i + 1 < n:
            x1 = text[i + 1]
            x2 = text[i + 2] if i + 2 < n else None
            if x1 in b"sm" or (x2 is not None and (x1, x2) in ((0x72, 0x65), (0x76, 0x65))):
                out.pop()  # " 's", " 'm", " 're", " 've" lose their space; " 't" " 'd" " 'll" keep
        out.append(x)
    return bytes(out)


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


class StreamDecoder:
    """Incremental detokenizer: `feed(id)` returns the text completed by that token and holds
    back a partial UTF-8 character; `flush()` returns what is left (U+FFFD for a truncated
    character). Pieces are raw `token_to_piece` output, without detokenize's space clean-up,
    as llama.cpp streams them (`common_token_to_piece`)."""

    def __init__(self, tokenizer: Tokenizer, special: bool = False,
                 preserved: frozenset[int] = frozenset()):
        self._tokenizer = tokenizer
        self._special = special
        self._preserved = preserved  # special tokens rendered as text all the same
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        special = self._special or token_id in self._preserved
        return self._decoder.decode(self._tokenizer.token_to_piece(token_id, special))

    def flush(self) -> str:
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return text


class Tokenizer:
    """llama.cpp-exact tokenizer for a GGUF vocabulary; build with `from_metadata`."""

    def __init__(self, vocab: Vocab, hf: tokenizers.Tokenizer | None):
        self._vocab = vocab
        self._hf = hf  # BPE vocabularies
        self._spm = SpmEncoder(vocab) if vocab.kind == "spm" else None
        self._tokens = vocab.tokens
        self._attrs = vocab.attrs
        self._pieces: dict[int, bytes] = {}  # decoded pieces, filled as tokens are seen
        self._specials_all, self._specials_user = self._special_cache()
        self.n_vocab: int = len(vocab.tokens)
        self.bos_id: int | None = vocab.ids["bos"]
        self.eos_id: int | None = vocab.ids["eos"]
        self.eot_id: int | None = vocab.ids["eot"]
        self.add_bos: bool = vocab.add_bos
        self.add_eos: bool = vocab.add_eos
        self.add_space_prefix: bool = vocab.add_space_prefix
        self.eog_ids: frozenset[int] = vocab.eog_ids
        self.kind: str = vocab.kind
        self.pre: str = vocab.pre

    @classmethod
    def from_metadata(cls, meta: dict, cache_dir: Path | None = None) -> Tokenizer:
        """Build from GGUF metadata (`GGUFFile(path).metadata`). A BPE vocabulary's merge
        table is cached in `cache_dir` (default: `default_cache_dir()`)."""
        vocab = read_vocab(meta)
        if vocab.kind == "spm":
            return cls(vocab, None)
        hf = _load_or_build(vocab, Path(cache_dir) if cache_dir else default_cache_dir())
        return cls(vocab, hf)

    # -- encoding ------------------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """llama.cpp `tokenize(text, add_special, parse_special)`. The text must be valid
        Unicode: lone surrogates (undecodable bytes kept by Python's surrogateescape, or
        JSON's unpaired \\ud800 escapes) are refused rather than tokenized differently from
        llama.cpp's byte-level splitting."""
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise EdgeInferError(f"text is not valid UTF-8 (a lone surrogate at character "
                                     f"{exc.start})") from None
        fragments = self._partition(text, parse_special) if text else []
        ids: list[int] = []
        if add_special and self.add_bos:
            ids.append(self._required("bos"))
        if self._vocab.kind == "spm":
            self._encode_spm(fragments, ids)
        else:
            self._encode_bpe(fragments, ids)
        if add_special and self.add_eos:
            ids.append(self._required("eos"))
        return ids

    def _required(self, key: str) -> int:
        tid = self._vocab.ids[key]
        if tid is None:
            raise EdgeInferError(f"tokenizer adds {key.upper()} but the GGUF has no {key} token")
        return tid

    def _encode_spm(self, fragments: list[str | int], ids: list[int]) -> None:
        prev_special = True  # the text start counts as "after a special token"
        for frag in fragments:
            if isinstance(frag, int):
                ids.append(frag)
                prev_special = True
                continue
            if self._vocab.add_space_prefix and prev_special:
                frag = " " + frag
            self._spm.encode(frag.replace(" ", _SPACE_MARK), ids)
            prev_special = False

    def _encode_bpe(self, fragments: list[str | int], ids: list[int]) -> None:
        for frag in fragments:
            if isinstance(frag, int):
                ids.append(frag)
            elif self._vocab.kind == "raw_bpe":
                self._encode_raw_bpe(frag.replace(" ", _SPACE_MARK), ids)
            else:
                ids += self._hf.encode(frag, add_special_tokens=False).ids

    def _encode_raw_bpe(self, text: str, ids: list[int]) -> None:
        # Gemma 4: pieces are newline runs and the lines between them; a newline run that is a
        # token is emitted whole (llama.cpp PR 21343).
        for piece in _NEWLINE_RUNS.findall(text):
            tid = self._hf.token_to_id(piece) if piece[0] == "\n" else None
            if tid is not None:
                ids.append(tid)
            else:
                ids += self._hf.encode(piece, add_special_tokens=False).ids

    def _special_cache(self) -> tuple[list[tuple], list[tuple]]:
        """(prefix, text, id, lstrip, rstrip) of every partition token, longest UTF-8 first,
        and the subset still split out when parse_special is off (not CONTROL/UNKNOWN). The
        prefix is the text's first two characters (see `_partition`)."""
        cached = np.flatnonzero(self._attrs & SPECIAL_CACHE_ATTRS)
        texts = [self._tokens[t] for t in cached.tolist()]
        byte_len = np.array([len(t.encode("utf-8", "surrogateescape")) for t in texts])
        order = np.argsort(-byte_len, kind="stable")  # equal lengths keep id order
        attrs = self._attrs[cached]
        ordered = [texts[i] for i in order.tolist()]
        entries = list(
            zip(
                [t[:2] for t in ordered],
                ordered,
                cached[order].tolist(),
                ((attrs[order] & int(Attr.LSTRIP)) != 0).tolist(),
                ((attrs[order] & int(Attr.RSTRIP)) != 0).tolist(),
            )
        )
        user = (attrs[order] & int(PARSE_SPECIAL_ATTRS)) == 0
        return entries, [e for e, keep in zip(entries, user.tolist()) if keep]

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Gemma 3 has 6.4k partition tokens (6.2k of them `<unused...>`) but 21 distinct
        two-character prefixes: looking for the prefixes first skips the tokens that cannot
        occur (docs/performance.md, "Special-token prefixes"). Fragments are substrings of
        the text, so a token absent from it is absent from them."""
        fragments: list[str | int] = [text]
        entries = self._specials_all if parse_special else self._specials_user
        present: dict[str, bool] = {}
        for prefix, token, *rest in entries:
            found = present.get(prefix)
            if found is None:
                found = present[prefix] = prefix in text
            if found and token in text:
                fragments = _split_fragments(fragments, token, *rest)
        return fragments

    # -- decoding ------------------------------------------------------------------------------

    def token_to_piece(self, token_id: int, special: bool = False) -> bytes:
        """llama.cpp `token_to_piece(id, lstrip=0, special)`: the token's bytes; CONTROL and
        UNKNOWN tokens are empty unless `special`."""
        if not 0 <= token_id < self.n_vocab:
            raise EdgeInferError(f"token id {token_id} is outside the vocabulary ({self.n_vocab})")
        if not special and self._attrs[token_id] & PARSE_SPECIAL_ATTRS:
            return b""
        piece = self._pieces.get(token_id)
        if piece is None:
            piece = self._pieces[token_id] = self._make_piece(token_id)
        return piece

    def _make_piece(self, token_id: int) -> bytes:
        attr, text = int(self._attrs[token_id]), self._tokens[token_id]
        if attr & (PARSE_SPECIAL_ATTRS | Attr.USER_DEFINED):
            return text.encode("utf-8", "surrogateescape")
        if attr & Attr.NORMAL:
            if self._vocab.kind == "bpe":
                return _byte_level_bytes(text)
            return text.replace(_SPACE_MARK, " ").encode("utf-8", "surrogateescape")
        if attr & Attr.BYTE:
            return bytes([_byte_token_value(text)])
        return b""  # UNUSED / UNDEFINED

    def decode(self, ids: Iterable[int], special: bool = False) -> str:
        """llama.cpp `detokenize(ids, remove_special=False, unparse_special=special)`, as
        `common_detokenize` calls it: the first token loses one leading space when the vocab
        adds a space prefix, then the HF-style space clean-up runs if the vocab asks for it."""
        pieces = [self.token_to_piece(int(t), special) for t in ids]
        if pieces and self._vocab.add_space_prefix and pieces[0][:1] == b" ":
            pieces[0] = pieces[0][1:]
        data = b"".join(pieces)
        if self._vocab.clean_spaces:
            data = _clean_spaces(data)
        return data.decode("utf-8", errors="replace")

    def stream_decoder(self, special: bool = False,
                       preserved: frozenset[int] = frozenset()) -> StreamDecoder:
        return StreamDecoder(self, special, preserved)

    # -- token facts ---------------------------------------------------------------------------

    def token_text(self, token_id: int) -> str:
        """The raw vocabulary string (`▁`/`Ġ` spellings, `<0xXX>` byte tokens)."""
        return self._tokens[token_id]

    def token_attr(self, token_id: int) -> Attr:
        return Attr(int(self._attrs[token_id]))

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.eog_ids

    def special_ids(self) -> list[int]:
        """CONTROL and UNKNOWN tokens: those whose piece is empty unless asked for."""
        attrs = np.asarray(self._attrs, dtype=np.int64)
        return np.flatnonzero(attrs & int(PARSE_SPECIAL_ATTRS)).tolist()

    def is_control(self, token_id: int) -> bool:
        return bool(self._attrs[token_id] & Attr.CONTROL)


def _split_fragments(
    fragments: list[str | int], text: str, token_id: int, lstrip: bool, rstrip: bool
) -> list[str | int]:
    """Split every occurrence of one special token out of the raw-text fragments, trimming
    ASCII whitespace next to it for LSTRIP/RSTRIP tokens (`tokenizer_st_partition`)."""
    out: list[str | int] = []
    for frag in fragments:
        if isinstance(frag, int) or text not in frag:
            out.append(frag)
            continue
        pos = 0
        while (match := frag.find(text, pos)) >= 0:
            left = frag[pos:match]
            if lstrip:
                left = left.rstrip(_C_ISSPACE)
            if left:
                out.append(left)
            out.append(token_id)
            pos = match + len(text)
            if rstrip:
                while pos < len(frag) and frag[pos] in _C_ISSPACE:
                    pos += 1
        if pos < len(frag):
            out.append(frag[pos:])
    return out
