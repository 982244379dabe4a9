"""Tokenizer that reproduces llama.cpp's token ids from GGUF metadata.

llama.cpp (`src/llama-vocab.cpp`) tokenizes in two stages, and so do we:

1. **Special-token partition** (`tokenizer_st_partition`), done here in Python: every CONTROL,
   UNKNOWN and USER_DEFINED token is searched in the raw text, longest (in UTF-8 bytes) first,
   and split out. With `parse_special=False` CONTROL/UNKNOWN tokens are left as text but
   USER_DEFINED ones are still split out. HF `tokenizers` matches added tokens leftmost-longest
   instead, which differs for overlapping tokens, so we never give it added tokens.
2. **Each remaining text fragment** goes through an HF `tokenizers.Tokenizer` built to match:
   * `gpt2` vocabularies: byte-level BPE, the pre-tokenizer being llama.cpp's regex list for
     `tokenizer.ggml.pre` (`tokenizer_tables.PRE_TYPES`) as `Split(..., "isolated")` steps;
   * `llama` (SentencePiece) vocabularies: llama.cpp merges the adjacent pair whose result has
     the highest *score*, so a BPE whose merges split tokens in two, ranked by the result's
     score, gives the same ids (`_spm_merge_table`); spaces become `▁`, and a `' '` is
     prepended to every fragment that starts the text or follows a special token when
     `add_space_prefix`;
   * `gemma4`: BPE over raw UTF-8 with `▁` spaces, split at newline runs.

Deriving the 262k-token SPM merges costs seconds, so the merge table is cached (`.npy`) under
`cache_dir`, keyed by a hash of everything it is built from. Detokenization uses per-id
byte pieces with llama.cpp's `token_to_piece` rules, built lazily, never HF decoders (they
differ on control, unknown and user-defined tokens). Reference: shared/docs/tokenizer.md.
"""

from __future__ import annotations

import codecs
import hashlib
import heapq
import os
import re
import tempfile
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

# Bump when the cached JSON's meaning changes (how merges or pre-tokenizers are built).
_CACHE_FORMAT = "edgeinfer-merges-2"
_SPACE_MARK = "\u2581"  # SentencePiece's "▁"
_C_ISSPACE = " \t\n\v\f\r"  # llama.cpp strips with C isspace(), which is ASCII only
_NEWLINE_RUNS = re.compile(r"[^\n]+|\n+")


# ---------------------------------------------------------------------------------------------
# Vocab -> HF tokenizers.Tokenizer (cached)
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


def _spm_last_merge(text: str, score_of: dict[str, float]) -> tuple[str, str] | None:
    """Run llama.cpp's SPM merge loop (`llm_tokenizer_spm_session`) on `text` alone and return
    the final merge if the whole text ends up as one symbol.

    Highest score first, ties to the leftmost pair; a queued pair is stale once either side
    has changed size."""
    n = len(text)
    syms = list(text)
    nxt = [*range(1, n), -1]
    prv = list(range(-1, n - 1))
    heap = []
    for i in range(n - 1):
        score = score_of.get(syms[i] + syms[i + 1])
        if score is not None:
            heap.append((-score, i, i + 1, 2))
    heapq.heapify(heap)
    last = None
    while heap:
        _, left, right, size = heapq.heappop(heap)
        a, b = syms[left], syms[right]
        if not a or not b or len(a) + len(b) != size:
            continue
        last = (a, b)
        merged = syms[left] = a + b
        syms[right] = ""
        nxt[left] = after = nxt[right]
        if after >= 0:
            prv[after] = left
            _push_pair(heap, score_of, left, after, merged, syms[after])
        if prv[left] >= 0:
            _push_pair(heap, score_of, prv[left], left, syms[prv[left]], merged)
    return last if len(syms[0]) == n else None


def _push_pair(heap: list, score_of: dict, left: int, right: int, a: str, b: str) -> None:
    score = score_of.get(a + b)
    if score is not None:
        heapq.heappush(heap, (-score, left, right, len(a) + len(b)))


def _spm_merge_table(vocab: Vocab) -> np.ndarray:
    """(n_merges, 3) [left, right, result] ids in rank order for an SPM vocabulary.

    llama.cpp merges the adjacent pair whose concatenation is the best-scoring token, which a
    BPE reproduces when its merges are ranked by the result's score. Of all the ways to split
    a token in two, only one can ever be its final merge: the one llama.cpp's loop takes on the
    token's own text (whatever surrounds a span, the merges inside it happen in the same order
    until the token forms). Keeping only that split halves the merges (Gemma 3: 236k instead
    of 515k), and with them the time `tokenizers` needs to build the model on every start.

    That argument needs HF's order to be llama.cpp's, which fails between different tokens of
    equal score (llama.cpp: leftmost pair first; HF: lowest rank first). Tokens whose score is
    shared keep every split, which is what makes e.g. llama-spm's `▁▁▁▁` come out whole."""
    hf_vocab = _hf_vocab(vocab)
    score_list = vocab.scores.tolist()
    score_of = {t: score_list[i] for t, i in hf_vocab.items()}
    _, inverse, counts = np.unique(vocab.scores, return_inverse=True, return_counts=True)
    tied = (counts[inverse] > 1).tolist()
    rows = []
    for token, tid in hf_vocab.items():
        if len(token) < 2:
            continue
        if tied[tid]:
            splits = [(token[:k], token[k:]) for k in range(1, len(token))]
        else:
            split = _spm_last_merge(token, score_of)
            splits = [split] if split is not None else []
        # HF merges need both halves in the vocab; llama.cpp can also merge a character that
        # is not a token (a known, rare difference: HF falls back to bytes there).
        rows += [
            (hf_vocab[a], hf_vocab[b], tid) for a, b in splits if a in hf_vocab and b in hf_vocab
        ]
    table = np.asarray(rows, dtype=np.int32).reshape(-1, 3)
    order = np.lexsort((table[:, 2], -vocab.scores[table[:, 2]].astype(np.float64)))
    return table[order]


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


def _merge_table(vocab: Vocab) -> np.ndarray:
    if vocab.kind == "spm":
        return _spm_merge_table(vocab)
    return _bpe_merge_table(vocab)


def _build_hf(vocab: Vocab, table: np.ndarray) -> tokenizers.Tokenizer:
    tokens = vocab.tokens
    pairs = list(zip(_lookup(tokens, table[:, 0]), _lookup(tokens, table[:, 1])))
    hf_vocab = _hf_vocab(vocab)
    if vocab.kind == "spm":
        unk = vocab.ids.get("unk")
        model = models.BPE(
            hf_vocab,
            pairs,
            unk_token=tokens[unk] if unk is not None else None,
            byte_fallback=True,
            fuse_unk=False,
        )
        return tokenizers.Tokenizer(model)  # no normalizer: spaces are escaped by the caller
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
        table = _merge_table(vocab)
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

    def __init__(self, tokenizer: Tokenizer, special: bool = False):
        self._tokenizer = tokenizer
        self._special = special
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        return self._decoder.decode(self._tokenizer.token_to_piece(token_id, self._special))

    def flush(self) -> str:
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return text


class Tokenizer:
    """llama.cpp-exact tokenizer for a GGUF vocabulary; build with `from_metadata`."""

    def __init__(self, vocab: Vocab, hf: tokenizers.Tokenizer):
        self._vocab = vocab
        self._hf = hf
        self._tokens = vocab.tokens
        self._attrs = vocab.attrs
        self._pieces: list[bytes | None] = [None] * len(vocab.tokens)
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
        """Build from GGUF metadata (`GGUFFile(path).metadata`). The derived merge table is
        cached in `cache_dir` (default: `default_cache_dir()`)."""
        vocab = read_vocab(meta)
        hf = _load_or_build(vocab, Path(cache_dir) if cache_dir else default_cache_dir())
        return cls(vocab, hf)

    # -- encoding ------------------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """llama.cpp `tokenize(text, add_special, parse_special)`."""
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
            ids += self._hf.encode(frag.replace(" ", _SPACE_MARK), add_special_tokens=False).ids
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
        """(text, id, lstrip, rstrip) of every partition token, longest UTF-8 first, and the
        subset still split out when parse_special is off (not CONTROL/UNKNOWN)."""
        cached = np.flatnonzero(self._attrs & SPECIAL_CACHE_ATTRS)
        texts = [self._tokens[t] for t in cached.tolist()]
        byte_len = np.array([len(t.encode("utf-8", "surrogateescape")) for t in texts])
        order = np.argsort(-byte_len, kind="stable")  # equal lengths keep id order
        attrs = self._attrs[cached]
        entries = list(
            zip(
                [texts[i] for i in order.tolist()],
                cached[order].tolist(),
                ((attrs[order] & int(Attr.LSTRIP)) != 0).tolist(),
                ((attrs[order] & int(Attr.RSTRIP)) != 0).tolist(),
            )
        )
        user = (attrs[order] & int(PARSE_SPECIAL_ATTRS)) == 0
        return entries, [e for e, keep in zip(entries, user.tolist()) if keep]

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        fragments: list[str | int] = [text]
        for entry in self._specials_all if parse_special else self._specials_user:
            if entry[0] in text:  # fragments are substrings of text: cheap early reject
                fragments = _split_fragments(fragments, *entry)
        return fragments

    # -- decoding ------------------------------------------------------------------------------

    def token_to_piece(self, token_id: int, special: bool = False) -> bytes:
        """llama.cpp `token_to_piece(id, lstrip=0, special)`: the token's bytes; CONTROL and
        UNKNOWN tokens are empty unless `special`."""
        if not 0 <= token_id < self.n_vocab:
            raise EdgeInferError(f"token id {token_id} is outside the vocabulary ({self.n_vocab})")
        if not special and self._attrs[token_id] & PARSE_SPECIAL_ATTRS:
            return b""
        piece = self._pieces[token_id]
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

    def stream_decoder(self, special: bool = False) -> StreamDecoder:
        return StreamDecoder(self, special)

    # -- token facts ---------------------------------------------------------------------------

    def token_text(self, token_id: int) -> str:
        """The raw vocabulary string (`▁`/`Ġ` spellings, `<0xXX>` byte tokens)."""
        return self._tokens[token_id]

    def token_attr(self, token_id: int) -> Attr:
        return Attr(int(self._attrs[token_id]))

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.eog_ids

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
