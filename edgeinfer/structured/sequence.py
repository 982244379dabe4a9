"""Per-sequence constraint state, and the masks of a batch filled at once.

A mask is llguidance's: one bit per token id, 32 to an int32 word, bit `t & 31` of word
`t >> 5`, set where the token is allowed. Masks are computed from the tokens accepted so far,
not from the logits, so a batch's masks can be filled while the forward pass runs (llguidance
releases the GIL).

One decode step of a constrained sequence, as llama.cpp's sampler does it with the grammar
applied before the chain (`common_sampler_sample`):

    seq.fill_mask(row)           # or MaskBatch.fill for all constrained sequences at once
    apply_bitmask(logits, row)   # disallowed -> -inf, before logit_bias and the samplers
    token = sample(logits)       # logit_bias, penalties, top-k ... cannot revive a -inf
    seq.accept(token)            # False: the matcher is in error (seq.error says why)
    if seq.is_stopped(): finish  # only end-of-generation is allowed from here

End-of-generation tokens are allowed exactly where the grammar may end (`is_accepting()`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numba import njit

from edgeinfer.structured import bridge

if TYPE_CHECKING:
    from edgeinfer.structured.compile import CompiledConstraint


def mask_words(n_vocab: int) -> int:
    """int32 words in a mask of `n_vocab` tokens."""
    return (n_vocab + 31) // 32


def mask_allows(mask: np.ndarray, token: int) -> bool:
    """Whether `token`'s bit is set in a mask row."""
    return token < 32 * mask.shape[0] and bool((int(mask[token >> 5]) >> (token & 31)) & 1)


@njit(cache=True, nogil=True)
def apply_bitmask(logits: np.ndarray, mask: np.ndarray) -> None:
    """logits (n_vocab,) float32, in place: -inf where the mask (n_words,) int32 has no bit,
    and for ids past the mask (a model whose output rows outnumber its tokens). A word at a
    time: a grammar's mask is mostly whole words of allowed or banned tokens."""
    n = logits.shape[0]
    for w in range(mask.shape[0]):
        bits = mask[w]
        if bits == -1:
            continue
        start, stop = w * 32, min(w * 32 + 32, n)
        if bits == 0:
            logits[start:stop] = -np.inf
            continue
        for i in range(start, stop):
            if (bits >> (i - start)) & 1 == 0:
                logits[i] = -np.inf
    logits[min(n, mask.shape[0] * 32):] = -np.inf


@njit(cache=True, nogil=True)
def apply_bitmasks(logits: np.ndarray, masks: np.ndarray, rows: np.ndarray) -> None:
    """logits (n, n_vocab) float32, in place: row j masked by masks[rows[j]] (masks
    (n_rows, n_words) int32); rows[j] < 0 leaves row j alone (an unconstrained sequence)."""
    for j in range(logits.shape[0]):
        if rows[j] >= 0:
            apply_bitmask(logits[j], masks[rows[j]])


class SequenceConstraint:
    """One sequence's position in a compiled constraint (an llguidance matcher). Not shared
    between threads: one engine thread owns it."""

    def __init__(self, compiled: CompiledConstraint, matcher: Any):
        self.compiled = compiled
        self._matcher = matcher
        self._mask = np.full(mask_words(compiled.n_vocab), -1, dtype=np.int32)  # for apply()

    def allows(self, token: int) -> bool:
        """Whether `token` may come next (without computing the whole mask)."""
        return self._matcher.validate_tokens([token]) == 1

    def new_mask(self) -> np.ndarray:
        """A mask row for this vocabulary (allocate once, fill every step)."""
        return np.zeros(mask_words(self.compiled.n_vocab), dtype=np.int32)

    def fill_mask(self, row: np.ndarray) -> None:
        """Write the next token's mask into `row` ((n_words,) int32, C-contiguous)."""
        _check_row(row, self._mask.shape[0])
        self._matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)

    def apply(self, logits: np.ndarray) -> None:
        """Compute the mask and set the disallowed logits ((n_vocab,) float32) to -inf."""
        self.fill_mask(self._mask)
        apply_bitmask(logits, self._mask)

    def accept(self, token: int) -> bool:
        """Advance past a sampled token; False if the grammar does not allow it (the matcher
        is then in error and stays there, allowing only end-of-generation)."""
        return self._matcher.consume_token(int(token))

    def accept_tokens(self, tokens: Sequence[int]) -> int:
        """Advance past as many of `tokens` as the grammar allows; how many that was."""
        return self._matcher.try_consume_tokens([int(t) for t in tokens])

    def rollback(self, n_tokens: int) -> bool:
        """Undo the last `n_tokens` accepted (a rejected draft, a stop string held back)."""
        return self._matcher.rollback(n_tokens)

    def reset(self) -> bool:
        """Back to the start of the output."""
        return self._matcher.reset()

    def is_accepting(self) -> bool:
        """The output so far is complete: end-of-generation is allowed."""
        return self._matcher.is_accepting()

    def is_stopped(self) -> bool:
        """Nothing but end-of-generation can follow (the grammar is finished, or in error)."""
        return self._matcher.is_stopped()

    def fork(self) -> SequenceConstraint:
        """An independent copy at the same position (n choices from one prompt)."""
        return SequenceConstraint(self.compiled, self._matcher.deep_copy())

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar forces next, whatever the model says (may be empty)."""
        return self._matcher.compute_ff_tokens()

    @property
    def error(self) -> str | None:
        """Why the matcher failed, on one line; None while it has not."""
        if not self._matcher.is_error():
            return None
        from edgeinfer.structured.compile import one_line

        return one_line(self._matcher.get_error())


class MaskBatch:
    """The masks of up to `n_rows` sequences, (n_rows, n_words) int32, allocated once and
    filled by llguidance's thread pool in one call."""

    def __init__(self, n_rows: int, n_vocab: int):
        self.masks = np.full((n_rows, mask_words(n_vocab)), -1, dtype=np.int32)

    def fill(self, rows: Sequence[int], seqs: Sequence[SequenceConstraint]) -> None:
        """Write seqs[k]'s next-token mask into masks[rows[k]], in parallel."""
        masks = self.masks
        if len(seqs) <= 1:
            for row, seq in zip(rows, seqs):
                seq.fill_mask(masks[row])
            return
        for seq in seqs:
            _check_row(masks[0], seq._mask.shape[0])
        pairs = [(seq._matcher, int(row)) for row, seq in zip(rows, seqs)]
        bridge.executor().unsafe_compute_mask_ptr(pairs, masks.ctypes.data,
                                                  masks.shape[1] * 4, masks.shape[0])

    def apply(self, logits: np.ndarray, rows: np.ndarray) -> None:
        """Mask logits (n, n_vocab) float32 in place, row j by masks[rows[j]] ((n,) int32;
        -1 for a row left unconstrained)."""
        apply_bitmasks(logits, self.masks, rows)


def _check_row(row: np.ndarray, n_words: int) -> None:
    """The matcher writes raw memory: the row must be exactly one mask."""
    if row.dtype != np.int32 or row.shape != (n_words,) or not row.flags.c_contiguous:
        raise ValueError(f"a mask row must be ({n_words},) C-contiguous int32, not "
                         f"{row.shape} {row.dtype}")
