"""Drafting with a smaller model of the same vocabulary: llama.cpp's `draft-simple` (-md).

The draft model has its own KV cache, a slot per target slot. Before drafting it catches up
on the tokens of the sequence it has not seen (the prompt, then the accepted tokens; cells
past the accepted ones are simply written again), then proposes its most likely token, one
forward pass each, while that token's probability among its top 10 is at least p_min. Its
drafts are a point mass, so checking them by sampling the target and comparing is the
rejection rule of Leviathan et al. (accept x with probability p(x), else sample p without x).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from edgeinfer.errors import EdgeInferError
from edgeinfer.kv.prefix import common_prefix

VOCAB_MAX_DIFF = 128  # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
VOCAB_CHECK_FROM = 5  # llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID
TOP_K = 10  # the draft's sampler: top-k 10, then its most likely token


def vocab_mismatch(target, draft) -> str | None:
    """Why draft's tokenizer cannot draft for target's (llama.cpp's
    common_speculative_are_compatible), or None."""
    if target.kind != draft.kind:
        return f"vocabulary type {draft.kind} differs from the target's {target.kind}"
    if target.add_bos != draft.add_bos or (target.add_bos and target.bos_id != draft.bos_id):
        return "its BOS token differs from the target's"
    if target.add_eos != draft.add_eos or (target.add_eos and target.eos_id != draft.eos_id):
        return "its EOS token differs from the target's"
    if abs(target.n_vocab - draft.n_vocab) > VOCAB_MAX_DIFF:
        return f"{draft.n_vocab} tokens against the target's {target.n_vocab}"
    for i in range(VOCAB_CHECK_FROM, min(target.n_vocab, draft.n_vocab)):
        if target.token_text(i) != draft.token_text(i):
            return (f"token {i} is {draft.token_text(i)!r}, the target's "
                    f"{target.token_text(i)!r}")
    return None


class DraftModel:
    """A loaded draft model and one KV slot per target slot; `drafter(slot, prompt)`."""

    def __init__(self, model, target_tokenizer, n_ctx: int):
        why = vocab_mismatch(target_tokenizer, model.tokenizer)
        if why is not None:
            raise EdgeInferError(f"the draft model {model.path.name} cannot draft for this "
                                 f"model: {why}")
        self.model, self.n_ctx = model, n_ctx
        tf = model.transformer
        self.n_vocab = min(model.config.n_vocab, target_tokenizer.n_vocab)
        self.logits = np.zeros((1, model.config.n_vocab), np.float32)
        self.rows = np.zeros(1, np.int32)
        self.slot_ids = np.zeros(tf.n_batch, np.int32)
        self.positions = np.arange(n_ctx, dtype=np.int32)
        self.tokens = np.zeros(tf.n_batch, np.int32)
        self.seen: dict[int, list[int]] = {}  # slot -> tokens whose K/V its cells hold

    @classmethod
    def load(cls, path, target, n_slots: int, threads: int | None = None) -> DraftModel:
        """Load the GGUF at path to draft for `target` (an api.Model) in n_slots slots."""
        from edgeinfer.api import Model

        n_ctx = target.transformer.n_ctx
        model = Model.load(path, n_ctx=n_ctx, threads=threads, n_slots=n_slots,
                           warm_up=None)
        return cls(model, target.tokenizer, n_ctx)

    def drafter(self, slot: int, prompt: Iterable[int], p_min: float) -> ModelDrafter:
        return ModelDrafter(self, slot, prompt, p_min)

    def catch_up(self, slot: int, history: list[int]) -> None:
        """Make slot's cells hold history[:-1] and its logits row follow history."""
        tf = self.model.transformer
        seen = self.seen.setdefault(slot, [])
        n = min(common_prefix(seen, history), len(history) - 1)  # the last runs for logits
        del seen[n:]
        while n < len(history):
            m = min(tf.n_batch, len(history) - n)
            self.tokens[:m] = history[n : n + m]
            self.slot_ids[:m] = slot
            self.rows[0] = m - 1
            tf.forward(self.tokens[:m], self.positions[n : n + m], self.slot_ids[:m],
                       self.rows, self.logits)
            seen.extend(history[n : n + m])
            n += m

    def propose(self, slot: int, history: list[int], limit: int, p_min: float) -> list[int]:
        """Up to `limit` tokens the draft model expects after history."""
        limit = min(limit, self.n_ctx - len(history))
        if limit <= 0 or not history:
            return []
        self.catch_up(slot, history)
        seen, draft = self.seen[slot], []
        row = self.logits[0, : self.n_vocab]
        tf = self.model.transformer
        while True:
            token, p = _top(row)
            if p < p_min:
                break
            draft.append(token)
            if len(draft) == limit:
                break
            self.tokens[0], self.slot_ids[0], self.rows[0] = token, slot, 0
            tf.forward(self.tokens[:1], self.positions[len(seen) : len(seen) + 1],
                       self.slot_ids[:1], self.rows, self.logits)
            seen.append(token)
        return draft


def _top(row: np.ndarray) -> tuple[int, float]:
    """The most likely token and its probability among the top TOP_K (llama.cpp's draft
    sampler: top-k, then softmax)."""
    k = min(TOP_K, len(row))
    top = np.argpartition(row, -k)[-k:]
    best = int(top[np.argmax(row[top])])
    p = 1.0 / float(np.exp(row[top] - row[best]).sum())
    return best, p


class ModelDrafter:
    """One sequence's drafts from the draft model (the drafter interface of ngram.py)."""

    def __init__(self, draft: DraftModel, slot: int, prompt: Iterable[int], p_min: float):
        self.draft_model, self.slot, self.p_min = draft, slot, p_min
        self.tokens: list[int] = list(prompt)

    def extend(self, tokens: Iterable[int]) -> None:
        self.tokens.extend(tokens)

    def draft(self, limit: int) -> list[int]:
        return self.draft_model.propose(self.slot, self.tokens, limit, self.p_min)
