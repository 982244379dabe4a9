"""Our `Tokenizer` as llguidance sees it: one `LLTokenizer` per vocabulary, built once.

llguidance walks a trie of every token's bytes to compute a mask, so it needs the vocabulary as
byte strings, which tokens are special, and which ids end generation. We give it what llama.cpp
gives it (`common/llguidance.cpp`, `llama_sampler_llg_new_tokenizer`):

* each token's bytes are `token_to_piece(id, special=True)`: text pieces as generated, byte
  tokens as their byte, SentencePiece `▁` as a space;
* special tokens are the CONTROL and UNKNOWN ones, the tokens whose piece is empty unless
  `special` is asked for (llama.cpp's test: empty without, non-empty with). llguidance marks them
  with a 0xFF prefix, so no grammar text can match them; a Lark grammar names them `<|im_end|>`.
  USER_DEFINED tokens (Gemma 3's newline and tab runs, `<start_of_image>`) stay text, as in
  llama.cpp, so the text the tokenizer splits into them is allowed;
* the end of generation is llama.cpp's choice, EOT if the vocabulary has one and EOS otherwise,
  then every other end-of-generation id: the mask allows all of them where the grammar may end,
  so the engine's usual EOG stop works whichever one the model prefers;
* the tokenize callback llguidance uses for text the grammar forces is our
  `encode(add_special=False, parse_special=False)`. llama.cpp parses special tokens there,
  which breaks a grammar literal spelling a special token (`"<|im_end|>"`): the mask then
  allows only the special token, which the matcher refuses as not being that text.

Building takes about 0.3 s for SmolLM2's 49k tokens and under 2 s for Gemma 3's 262k (half of it
collecting the pieces), hence the cache: one per `Tokenizer` object, dropped with it.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

from edgeinfer.errors import EdgeInferError

if TYPE_CHECKING:
    from edgeinfer.tokenizer import Tokenizer

INSTALL_HINT = "structured output needs llguidance: pip install 'edgeinfer[structured]'"

_lock = threading.Lock()
_ll_tokenizers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_executor: list[Any] = []  # the process's one LLExecutor, made on first use


def llguidance() -> Any:
    """The `llguidance` module, imported on first use so that edgeinfer runs without it; a
    one-line EdgeInferError naming the extra to install when it is missing."""
    try:
        import llguidance as module
    except ImportError:
        raise EdgeInferError(INSTALL_HINT) from None
    return module


class _VocabularyView:
    """The duck type `llguidance.LLTokenizer` accepts (its `TokenizerWrapper` protocol):
    `tokens` (bytes per id), `eos_token_id`, `bos_token_id`, `special_token_ids`, and a call
    that tokenizes a str."""

    is_tokenizer_wrapper = True

    def __init__(self, tokenizer: Tokenizer):
        piece = tokenizer.token_to_piece
        self.tokens = [piece(i, True) for i in range(tokenizer.n_vocab)]
        self.special_token_ids = special_ids(tokenizer)
        self.eos_token_id = eog_order(tokenizer)[0]
        self.bos_token_id = tokenizer.bos_id
        self._encode = tokenizer.encode

    def __call__(self, text: str) -> list[int]:
        return self._encode(text, add_special=False, parse_special=False)


def special_ids(tokenizer: Tokenizer) -> list[int]:
    """CONTROL and UNKNOWN tokens: those whose piece is empty unless `special` is asked for."""
    return tokenizer.special_ids()


def eog_order(tokenizer: Tokenizer) -> list[int]:
    """End-of-generation ids, llama.cpp's choice first (EOT, else EOS), then the others."""
    first = [t for t in (tokenizer.eot_id, tokenizer.eos_id) if t is not None][:1]
    rest = sorted(set(tokenizer.eog_ids) - set(first))
    ids = first + rest
    if not ids:
        raise EdgeInferError("structured output needs an end-of-generation token, and this "
                             "vocabulary has none")
    return ids


def ll_tokenizer(tokenizer: Tokenizer) -> Any:
    """The `llguidance.LLTokenizer` for `tokenizer`, built on first use and cached with it."""
    with _lock:
        found = _ll_tokenizers.get(tokenizer)
    if found is not None:
        return found
    module = llguidance()
    built = module.LLTokenizer(_VocabularyView(tokenizer), eos_token=eog_order(tokenizer))
    with _lock:
        return _ll_tokenizers.setdefault(tokenizer, built)


def executor() -> Any:
    """The process's `llguidance.LLExecutor`: a thread pool (80% of the CPUs, at most 32) that
    computes the masks of a batch in parallel, outside the GIL."""
    with _lock:
        if not _executor:
            _executor.append(llguidance().LLExecutor())
        return _executor[0]
