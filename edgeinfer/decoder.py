"""One sequence's decoding: everything between its logit rows and its text.

`SequenceDecoder` owns, for one sequence, what llama.cpp's server keeps per slot besides the
KV cells: the sampler and its penalty window, the constraint (the mask fallback, a lazy
grammar's trigger), speculation (a draft proposed, then verified against the rows computed
after it), the stream detokenizer and stop matcher, the finish reason and one `Timings`.
Both generation loops drive it the same way and keep only the forward pass and the cells:
`generate.generate_step` (run, chat, the Python API) for one sequence, the server's engine
for every sequence of its continuous batch.

    decoder = SequenceDecoder(tokenizer, prompt, sampler, n_ctx, ...)
    rows = forward(prompt[n_cached:])        # (1, n_vocab): after the prompt
    decoder.prompt_done(now)
    while decoder.finish is None:
        for out in decoder.step(rows, draft, now): ...      # its token, text, probs
        draft = decoder.propose()
        rows = forward([decoder.last_token, *draft])        # (1 + len(draft), n_vocab)

Stop types are llama.cpp's: "eos" (an end-of-generation token, or a grammar that is
complete), "word" (a stop string) and "limit" (n_predict, or the context is full).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeinfer.errors import ModelFault
from edgeinfer.sampling import log_sum_exp, top_logprobs, top_probs

if TYPE_CHECKING:
    from edgeinfer.sampling import Sampler
    from edgeinfer.spec.speculation import Speculation
    from edgeinfer.tokenizer import Tokenizer

log = logging.getLogger("edgeinfer.decoder")


@dataclass
class Timings:
    """llama.cpp's figures for one sequence (milliseconds). The first generated token comes
    from the prompt's logits, so the generation rate counts one decode step fewer."""

    prompt_n: int = 0  # prompt tokens processed, not found in the KV cache
    prompt_ms: float = 0.0
    cache_n: int = 0  # prompt tokens found in the KV cache
    predicted_n: int = 0
    predicted_ms: float = 0.0
    draft_n: int = 0  # tokens drafted for speculative decoding (llama.cpp's draft_n)
    draft_n_accepted: int = 0  # of them, kept

    @property
    def prompt_per_second(self) -> float:
        return 1e3 * self.prompt_n / self.prompt_ms if self.prompt_ms else 0.0

    @property
    def predicted_per_second(self) -> float:
        return 1e3 * self.predicted_n / self.predicted_ms if self.predicted_ms else 0.0

    def as_dict(self) -> dict:
        """llama-server's `timings` object (server_slot_stats)."""
        prompt_n, prompt_ms = self.prompt_n, self.prompt_ms
        gen_ms = max(1e-3, self.predicted_ms) if self.predicted_n else 0.0
        steps = max(0, self.predicted_n - 1)
        timings = {
            "cache_n": self.cache_n,
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": 1e3 / prompt_ms * prompt_n if prompt_ms > 0 else 0.0,
            "predicted_n": self.predicted_n,
            "predicted_ms": gen_ms,
            "predicted_per_token_ms": gen_ms / steps if steps else 0.0,
            "predicted_per_second": 1e3 / gen_ms * steps if gen_ms > 0 else 0.0,
        }
        if self.draft_n:
            timings["draft_n"] = self.draft_n
            timings["draft_n_accepted"] = self.draft_n_accepted
        return timings

    @classmethod
    def from_dict(cls, timings: dict) -> Timings:
        """A server's `timings` object read back (the fields it may leave out are 0)."""
        names = ("prompt_n", "prompt_ms", "cache_n", "predicted_n", "predicted_ms", "draft_n",
                 "draft_n_accepted")
        return cls(**{name: timings.get(name, 0) for name in names})


@dataclass
class TokenProbs:
    token: int
    logprob: float  # with post_sampling: the probability after the sampling chain
    top: list[tuple[int, float]]  # (id, logprob or probability), best first
    post_sampling: bool = False


@dataclass(frozen=True)
class ProbsRequest:
    """What a request asks to know of each token: its log-probability and the top n, or
    (post_sampling) the probabilities after the sampling chain."""

    n_probs: int = 0
    post_sampling: bool = False


@dataclass
class TokenText:
    """A token taken into the sequence and the text it releases (may be "": a partial
    character or stop string is held back)."""

    token: int
    text: str
    probs: TokenProbs | None = None


@dataclass
class Finish:
    stop_type: str  # "eos" | "word" | "limit"
    word: str = ""  # the stop string hit ("word")
    truncated: bool = False  # the context is full
    tail: str = ""  # the text held back until now


class ConstraintFault(ModelFault):
    """The constraint refused a token sampled under its own mask (a bug, never the model's)."""


class StopMatcher:
    """Holds back text that might be the start of a stop string (llama.cpp's partial match)."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Returns (text safe to emit, whether a stop string was hit)."""
        buf = self.pending + text
        hits = [(buf.find(s), s) for s in self.stops if s in buf]
        if hits:
            self.pending = ""
            return buf[: min(hits)[0]], True
        keep = max((_partial_suffix(buf, s) for s in self.stops), default=0)
        self.pending = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        text, self.pending = self.pending, ""
        return text


def _partial_suffix(text: str, stop: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of stop."""
    for n in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0


def first_stop(text: str, stops: Sequence[str]) -> str:
    """The stop string that occurs first in text ("" if none does)."""
    hits = [(text.find(s), s) for s in stops if s and s in text]
    return min(hits)[1] if hits else ""


class SequenceDecoder:
    """One sequence from its prompt's logits to its finish. `constraint`: a compiled
    grammar (edgeinfer.structured.CompiledConstraint), started at the first generated token
    after `prefill` (text the constraint is fed first), or at `lazy`'s trigger in the
    output (chat.grammar.LazyStart). `n_cached`: prompt tokens already in the KV cache.
    `ignore_eos`: end-of-generation tokens do not end it (the sampler's bias keeps them
    out). `name` labels log lines."""

    def __init__(self, tokenizer: Tokenizer, prompt: Sequence[int], sampler: Sampler,
                 n_ctx: int, *, n_predict: int = -1, stop: Sequence[str] = (),
                 constraint: Any = None, prefill: str = "", lazy: Any = None,
                 speculation: Speculation | None = None, probs: ProbsRequest | None = None,
                 preserved: frozenset[int] = frozenset(), ignore_eos: bool = False,
                 n_cached: int = 0, now: float = 0.0, name: str = ""):
        self.tokenizer, self.prompt, self.sampler, self.n_ctx = tokenizer, prompt, sampler, n_ctx
        self.n_predict, self.stop, self.ignore_eos = n_predict, tuple(stop), ignore_eos
        self.spec, self.probs, self.name = speculation, probs, name
        self.n_past = len(prompt)  # tokens in the sequence: where the next one goes
        self.n_decoded = 0
        self.last_token = -1
        self.finish: Finish | None = None
        self.timings = Timings(cache_n=n_cached)
        self.n_cached = n_cached
        self.t_start = self.t_prompt = self.t_last = now
        # the penalty window: repeat_last_n tokens, -1 the whole context (llama.cpp)
        last_n = sampler.params.repeat_last_n
        self.keep = n_ctx if last_n < 0 else last_n
        self.recent = list(prompt[max(0, len(prompt) - self.keep) :]) if self.keep else []
        self.detok = tokenizer.stream_decoder(preserved=preserved)
        self.matcher = StopMatcher(self.stop)
        self.source, self.lazy, self.lazy_text = constraint, lazy, ""
        self.constraint = self._start_constraint(prefill) if lazy is None else None
        self.mask: np.ndarray | None = None  # the constraint's next-token mask, on first use
        self.rows_used = self.n_accepted = 0  # of the last step: rows taken, drafts kept

    # -- the prompt --------------------------------------------------------------------------
    def prompt_progress(self, n_done: int, now: float) -> None:
        """n_done of the prompt's tokens (cached ones included) are in the KV cache."""
        self.t_last = now
        self.timings.prompt_n = n_done - self.n_cached
        self.timings.prompt_ms = 1e3 * (now - self.t_start) if n_done > self.n_cached else 0.0

    def prompt_done(self, now: float) -> None:
        """The prompt's logits are ready; with n_predict 0 that is the end."""
        self.prompt_progress(len(self.prompt), now)
        self.t_prompt = now
        if self.n_predict == 0:
            self._end(Finish("limit"))

    # -- speculation ---------------------------------------------------------------------------
    @property
    def n_draft_max(self) -> int:
        return self.spec.n_max if self.spec is not None else 0

    def propose(self, max_rows: int | None = None, n_seqs: int = 1) -> list[int]:
        """The draft to check after `last_token` in the next forward: [] without
        speculation, or when not worth it in a step that decodes n_seqs sequences; at most
        max_rows tokens, the context's room and the tokens still wanted."""
        if self.spec is None or self.finish is not None:
            return []
        limit = self.n_ctx - self.n_past  # cells after the last token's
        if self.n_predict >= 0:
            limit = min(limit, self.n_predict - self.n_decoded - 1)
        if max_rows is not None:
            limit = min(limit, max_rows)
        return self.spec.propose(limit, n_seqs)

    # -- the rows ------------------------------------------------------------------------------
    def step(self, rows: np.ndarray, draft: Sequence[int], now: float) -> Iterator[TokenText]:
        """rows (1 + len(draft), n_vocab): the logits after `last_token`, then after each
        drafted token. Each row is sampled as plain decoding samples it and the draft is
        kept up to the first token that differs, plus that token (the rejection rule for a
        drafted point mass: the same tokens). Yields each token taken; afterwards
        `rows_used` tells how many rows' cells are still valid after `last_token`'s,
        minus one, and `finish` is set if the sequence ended."""
        self.rows_used = accepted = 0
        for i in range(len(draft) + 1):
            self.rows_used = i + 1
            out = self._take(self._choose(rows[i], draft[i] if i < len(draft) else None, i),
                             now)
            if out is not None:
                yield out
            if self.finish is not None or i == len(draft) or out.token != draft[i]:
                break
            accepted += 1
        self.n_accepted = accepted
        if draft and self.spec is not None:
            self.spec.record(len(draft), accepted)
            self.timings.draft_n, self.timings.draft_n_accepted = (self.spec.drafted,
                                                                    self.spec.accepted)

    def _choose(self, row: np.ndarray, drafted: int | None,
                after: int) -> tuple[int, TokenProbs | None]:
        """The token `row` gives, which follows `after` accepted drafted tokens and is
        checked against `drafted` (None: nothing drafted there): sampled as plain decoding
        samples it, whatever was drafted, so the output's distribution is plain decoding's.
        (The tests replace this rule with biased ones to show they are caught.)"""
        return self._sample(row)

    def _sample(self, row: np.ndarray) -> tuple[int, TokenProbs | None]:
        """The next token, and its probabilities if asked for. A constrained sequence is
        sampled as llama.cpp's common_sampler_sample does: without the grammar first, and
        only if the token is not allowed, again with the grammar's mask applied first (the
        same token as mask-first under greedy, at a fraction of the cost)."""
        sampler, constraint, probs = self.sampler, self.constraint, self.probs
        if probs is not None and probs.post_sampling:
            mask = self._mask() if constraint is not None else None
            token, ids, dist = sampler.sample_with_probs(row, self.recent, mask)
            prob = float(dist[ids == token].sum())
            return token, TokenProbs(token, prob, top_probs(ids, dist, probs.n_probs), True)
        token = sampler.sample(row, self.recent)
        if constraint is not None and not constraint.allows(token):
            token = sampler.sample(row, self.recent, self._mask())
        if probs is None:
            return token, None
        return token, TokenProbs(token, float(row[token]) - log_sum_exp(row),
                                 top_logprobs(row, probs.n_probs))

    def _take(self, choice: tuple[int, TokenProbs | None], now: float) -> TokenText | None:
        """Take a sampled token into the sequence; None for one that ends it unseen (EOS)."""
        token, probs = choice
        position, self.n_past = self.n_past, self.n_past + 1
        self.n_decoded += 1
        self.t_last, self.last_token = now, token
        self.timings.predicted_n = self.n_decoded
        self.timings.predicted_ms = 1e3 * (now - self.t_prompt)
        self._remember(token)
        if self.spec is not None:
            self.spec.extend(token)
        constraint = self.constraint
        if constraint is not None and not constraint.accept(token):
            raise ConstraintFault(f"the constraint refused token {token}: {constraint.error}")
        if self.tokenizer.is_eog(token) and not self.ignore_eos:
            self._end(Finish("eos"))
            return None
        pending = self.matcher.pending
        piece = self.detok.feed(token)
        if self.lazy is not None and constraint is None and self.source is not None:
            self._watch_trigger(piece)
        text, hit = self.matcher.feed(piece)
        out = TokenText(token, text, probs)
        if hit:
            self._end(Finish("word", first_stop(pending + piece, self.stop)))
        elif constraint is not None and constraint.is_stopped():  # only EOS could follow
            self._end(Finish("eos"))
        elif self.n_decoded == self.n_predict:
            self._end(Finish("limit"))
        elif position >= self.n_ctx:  # no cell left for this token
            self._end(Finish("limit", truncated=True))
        return out

    def _remember(self, token: int) -> None:
        if self.keep:
            self.recent.append(token)
            if len(self.recent) > 2 * self.keep:  # trim now and then, not every step
                del self.recent[: -self.keep]

    def _end(self, finish: Finish) -> None:
        if finish.stop_type != "word":  # release what was held back
            tail, hit = self.matcher.feed(self.detok.flush())
            finish.tail = tail + ("" if hit else self.matcher.flush())
        self.finish = finish

    # -- the constraint ------------------------------------------------------------------------
    def _mask(self) -> np.ndarray:
        if self.mask is None:
            self.mask = self.constraint.new_mask()
        self.constraint.fill_mask(self.mask)
        return self.mask

    def _start_constraint(self, text: str) -> Any:
        """The constraint's state fed `text` as tokens; None without one, or when the
        grammar refuses that text (the generation then goes on unconstrained, as llama.cpp
        drops a grammar it cannot follow)."""
        if self.source is None:
            return None
        state = self.source.start()
        if text:
            ids = self.tokenizer.encode(text, add_special=False, parse_special=True)
            if state.accept_tokens(ids) != len(ids):
                log.warning("%s: the grammar refuses %r: %s; generating without it",
                            self.name or "a sequence", text[:60], state.error)
                self.source = None
                return None
        return state

    def _watch_trigger(self, piece: str) -> None:
        """A lazy constraint starts at its trigger: from then on the rest of the output,
        the trigger included, must follow the grammar."""
        self.lazy_text += piece
        start = self.lazy.find(self.lazy_text)
        if start is not None:
            self.constraint = self._start_constraint(self.lazy_text[start:])
