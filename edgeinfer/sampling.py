"""Token sampling with llama.cpp's semantics and defaults.

The chain is llama.cpp's default order (common/sampling.cpp), restricted to the samplers we
support: logit_bias -> penalties -> top_k -> top_p -> min_p -> temperature -> dist. Each
stage is a small pure function over a set of candidates (token ids plus their logits);
`Sampler` wires them together once per request and owns the only random state, a seeded
`np.random.Generator`.

Temperature <= 0 is greedy: argmax over the penalized logits (llama.cpp's greedy sampler).

`SamplingParams` and `N_PREDICT` (sampling_params.py, without numpy, for the CLI's start-up)
hold the defaults, llama.cpp's; every front end takes its defaults from them: the CLI's flags,
`RunOptions`, `Model.generate` and the server's request fields
(tests/test_sampling_defaults.py checks that they agree).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence

import numpy as np

from edgeinfer.errors import EdgeInferError, ModelFault
from edgeinfer.sampling_params import N_PREDICT, LogitBias, SamplingParams  # noqa: F401


def apply_penalties(logits: np.ndarray, recent: Sequence[int], params: SamplingParams) -> None:
    """Penalize, in place, every token seen in the last `repeat_last_n` of `recent`.

    As llama_sampler_penalties: a positive logit is divided by repeat_penalty, any other is
    multiplied by it; then count * frequency_penalty + presence_penalty is subtracted.
    """
    window = recent if params.repeat_last_n == -1 else recent[-params.repeat_last_n :]
    if len(window) == 0:
        return
    ids, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
    in_vocab = (ids >= 0) & (ids < logits.shape[0])
    ids, counts = ids[in_vocab], counts[in_vocab]
    values = logits[ids]
    values = np.where(values <= 0, values * params.repeat_penalty, values / params.repeat_penalty)
    values -= counts * params.frequency_penalty + params.presence_penalty
    logits[ids] = values


def sparse_bias(logit_bias: LogitBias) -> tuple[np.ndarray, np.ndarray]:
    """`logit_bias` as (ids, biases) arrays with each id once, its biases summed: built once
    per request, so applying it to a row is one fancy-indexed add."""
    if not logit_bias:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    for entry in logit_bias:
        if len(entry) != 2 or entry[0] < 0 or math.isnan(entry[1]):
            raise EdgeInferError(f"logit_bias entries are (token id >= 0, bias), got "
                                 f"{entry!r}")
    ids, where = np.unique(np.array([t for t, _ in logit_bias], np.int64), return_inverse=True)
    biases = np.zeros(ids.shape[0], np.float64)
    np.add.at(biases, where, np.array([b for _, b in logit_bias], np.float64))
    return ids, biases.astype(np.float32)


def top_k_candidates(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ids and logits of the k largest logits, sorted by descending logit.

    k <= 0 or k >= n_vocab keeps every token. argpartition keeps this O(n_vocab) when k is
    small; only the survivors are sorted.
    """
    n_vocab = logits.shape[0]
    if 0 < k < n_vocab:
        ids = np.argpartition(logits, n_vocab - k)[n_vocab - k :]
    else:
        ids = np.arange(n_vocab)
    order = np.argsort(-logits[ids], kind="stable")
    ids = ids[order]
    return ids, logits[ids]


def softmax(logits: np.ndarray) -> np.ndarray:
    """Numerically stable softmax in float64."""
    shifted = np.exp(logits.astype(np.float64) - np.max(logits))
    return shifted / shifted.sum()


def log_sum_exp(logits: np.ndarray) -> float:
    """log(sum(exp(logits))), computed stably; the log of softmax's denominator."""
    peak = float(np.max(logits))
    return peak + float(np.log(np.sum(np.exp(logits - peak), dtype=np.float64)))


def top_p_keep(sorted_logits: np.ndarray, p: float, log_norm: float | None = None) -> int:
    """How many of the descending `sorted_logits` top-p keeps: the shortest prefix whose
    probability mass reaches p (llama_sampler_top_p, min_keep = 1).

    `log_norm` is the softmax denominator's log when `sorted_logits` is only the head of the
    candidates; by default they are all the candidates.
    """
    if p >= 1.0:
        return sorted_logits.shape[0]
    if log_norm is None:
        log_norm = log_sum_exp(sorted_logits)
    cumulative = np.cumsum(np.exp(sorted_logits.astype(np.float64) - log_norm))
    return int(min(np.searchsorted(cumulative, p, side="left") + 1, sorted_logits.shape[0]))


def nucleus_candidates(
    logits: np.ndarray, p: float, first_try: int = 1024
) -> tuple[np.ndarray, np.ndarray]:
    """Top-p (p < 1) over the whole vocabulary, as ids and logits sorted best first.

    Same result as `top_p_keep` on the fully sorted logits, without sorting 262k of them:
    the best `first_try` tokens usually hold mass p already; only if not is all sorted.
    """
    n_vocab = logits.shape[0]
    log_norm = log_sum_exp(logits)
    head = min(first_try, n_vocab)
    ids, candidates = top_k_candidates(logits, head)
    n_keep = top_p_keep(candidates, p, log_norm)
    if n_keep == head < n_vocab:  # the head may not hold mass p: sort everything
        ids, candidates = top_k_candidates(logits, n_vocab)
        n_keep = top_p_keep(candidates, p, log_norm)
    return ids[:n_keep], candidates[:n_keep]


def min_p_filter(
    ids: np.ndarray, candidates: np.ndarray, p: float
) -> tuple[np.ndarray, np.ndarray]:
    """The candidates min-p keeps, sorted or not: probability at least p times the best
    one's, i.e. logit >= max + log(p) (llama_sampler_min_p). The best always survives."""
    if p <= 0.0:
        return ids, candidates
    keep = candidates >= np.max(candidates) + np.log(min(p, 1.0))
    return ids[keep], candidates[keep]


def check_finite(logits: np.ndarray) -> None:
    """Refuse a row whose best logit is NaN or infinite (max propagates NaN, so one NaN
    anywhere is found): no sampler can pick from it, and it means broken weights or
    hyperparameters. One pass over the row, next to the forward pass that made it."""
    peak = logits.max()
    if not np.isfinite(peak):
        kind = "NaN" if np.isnan(peak) else "infinite"
        raise ModelFault(f"the model produced {kind} logits (a corrupt or incompatible model "
                         "file?)")


def draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Index drawn from the distribution `probs` using one uniform from `rng`."""
    cumulative = np.cumsum(probs)
    index = np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right")
    return int(min(index, probs.shape[0] - 1))


class Sampler:
    """A sampling chain built once from `SamplingParams`; its only state is its RNG.

    `sample` never modifies the caller's logits: logit biases and penalties are applied to a
    scratch buffer that is allocated on the first call and reused afterwards.
    """

    def __init__(self, params: SamplingParams, logit_bias: LogitBias = ()) -> None:
        self.params = params
        self.seed: int = params.seed if params.seed is not None else secrets.randbits(32)
        self.rng = np.random.default_rng(self.seed)
        self._scratch: np.ndarray | None = None
        self._bias_ids, self._bias = sparse_bias(logit_bias)

    def reset(self) -> None:
        """Re-seed the RNG, so the sampler replays the same random stream."""
        self.rng = np.random.default_rng(self.seed)

    def sample(self, logits: np.ndarray, recent: Sequence[int] = (),
               mask: np.ndarray | None = None) -> int:
        """Pick the next token id from `logits` (n_vocab,), given the tokens so far; `mask`
        (a constraint's token bitmask, edgeinfer.structured) allows only its tokens.
        Raises ModelFault on NaN or infinite logits."""
        check_finite(logits)
        params = self.params
        logits = self.adjusted(logits, recent, mask)
        if params.temperature <= 0:
            return int(np.argmax(logits))
        ids, candidates = self._candidates(logits)
        probs = softmax(candidates / params.temperature)
        return int(ids[draw(probs, self.rng)])

    def sample_with_probs(self, logits: np.ndarray, recent: Sequence[int] = (),
                          mask: np.ndarray | None = None
                          ) -> tuple[int, np.ndarray, np.ndarray]:
        """`sample`, plus the distribution the token was drawn from: the ids and
        probabilities left after the chain, in no set order (greedy: the argmax alone, with
        probability 1). Same token, same RNG use as `sample`. llama-server's
        post_sampling_probs reports this distribution."""
        check_finite(logits)
        logits = self.adjusted(logits, recent, mask)
        if self.params.temperature <= 0:
            token = int(np.argmax(logits))
            return token, np.array([token]), np.ones(1)
        ids, candidates = self._candidates(logits)
        probs = softmax(candidates / self.params.temperature)
        return int(ids[draw(probs, self.rng)]), ids, probs

    def adjusted(self, logits: np.ndarray, recent: Sequence[int] = (),
                 mask: np.ndarray | None = None) -> np.ndarray:
        """`logits` with the constraint's mask (first: nothing after it can revive a
        token it bans), the logit biases and the penalties applied: the scratch buffer, or
        `logits` itself when none is active."""
        penalize = self.params.penalties_active and len(recent) > 0
        if not penalize and self._bias_ids.shape[0] == 0 and mask is None:
            return logits
        if self._scratch is None or self._scratch.shape != logits.shape:
            self._scratch = np.empty(logits.shape, dtype=np.float32)
        np.copyto(self._scratch, logits)
        if mask is not None:
            from edgeinfer.structured.sequence import apply_bitmask

            apply_bitmask(self._scratch, mask)
        if self._bias_ids.shape[0]:
            if self._bias_ids[-1] >= logits.shape[0]:  # sorted: the last is the largest
                raise EdgeInferError(f"logit_bias names token {self._bias_ids[-1]}, outside "
                                     f"the vocabulary ({logits.shape[0]})")
            self._scratch[self._bias_ids] += self._bias
        if penalize:
            apply_penalties(self._scratch, recent, self.params)
        return self._scratch

    def _candidates(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and logits that survive top_k -> top_p -> min_p."""
        params = self.params
        n_vocab = logits.shape[0]
        if 0 < params.top_k < n_vocab:
            ids, candidates = top_k_candidates(logits, params.top_k)
            n_keep = top_p_keep(candidates, params.top_p)
            ids, candidates = ids[:n_keep], candidates[:n_keep]
        elif params.top_p < 1.0:
            ids, candidates = nucleus_candidates(logits, params.top_p)
        else:  # every token, unsorted: neither min_p nor the draw needs an order
            ids, candidates = np.arange(n_vocab), logits
        return min_p_filter(ids, candidates, params.min_p)


def make_sampler(params: SamplingParams | None = None, logit_bias: LogitBias = ()) -> Sampler:
    """Build the sampling chain for one request (defaults: llama.cpp's)."""
    return Sampler(params if params is not None else SamplingParams(), logit_bias)


def top_probs(ids: np.ndarray, probs: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The k most likely of a distribution (`sample_with_probs`'s), best first, leaving out
    tokens of probability 0 (as llama-server's populate_token_probs does)."""
    k = max(0, min(k, ids.shape[0]))
    if k == 0:
        return []
    best = np.argpartition(-probs, k - 1)[:k] if k < ids.shape[0] else np.arange(ids.shape[0])
    best = best[np.argsort(-probs[best], kind="stable")]
    return [(int(ids[i]), float(probs[i])) for i in best if probs[i] > 0.0]


def top_logprobs(logits: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The k most likely tokens and their log-probabilities under softmax(logits).

    Uses the raw logits, before any sampler, as OpenAI's `top_logprobs` and llama-server's
    `n_probs` report them. Sorted by descending probability.
    """
    n_vocab = logits.shape[0]
    k = max(0, min(k, n_vocab))
    if k == 0:
        return []
    log_norm = log_sum_exp(logits)
    ids, top = top_k_candidates(logits, k)
    return [(int(i), float(v) - log_norm) for i, v in zip(ids, top, strict=True)]
