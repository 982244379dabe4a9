"""Generation in three layers; only the CLI (outermost) prints.

- `generate_step` yields token ids: prefill the prompt in one batched forward, then decode one
  token per step into preallocated buffers.
- `stream_generate` turns ids into `GenerationEvent`s: text pieces that never split a UTF-8
  character, stop strings held back until they can no longer match, a finish reason and
  llama.cpp-style timings.
- `edgeinfer.api.Model.generate` yields just the text, and the CLI prints it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeinfer.errors import EdgeInferError
from edgeinfer.spec import SpecParams
from edgeinfer.spec.speculation import Speculation

if TYPE_CHECKING:
    from edgeinfer.api import Model
    from edgeinfer.sampling import Sampler


@dataclass
class Timings:
    """llama.cpp's end-of-run figures (milliseconds)."""

    prompt_n: int = 0  # prompt tokens processed (llama.cpp's prompt_n)
    prompt_ms: float = 0.0
    cache_n: int = 0  # prompt tokens found in the KV cache, not processed again
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


@dataclass
class GenerationEvent:
    text: str  # new text since the previous event (may be "")
    token: int | None  # the token that produced it; None on the final event
    finish_reason: str | None = None  # "stop" (EOS or stop string) or "length"
    timings: Timings = field(default_factory=Timings)


def check_prompt(n_prompt: int, n_ctx: int) -> None:
    if n_prompt == 0:
        raise EdgeInferError("empty prompt: nothing to generate from")
    if n_prompt >= n_ctx:
        raise EdgeInferError(
            f"prompt is too long ({n_prompt} tokens) for the context size ({n_ctx} tokens); "
            "use a larger -c/--ctx-size or a shorter prompt"
        )


def generate_step(model: Model, prompt: Sequence[int], sampler: Sampler,
                  timings: Timings, slot: int = 0, constraint: Any = None,
                  n_past: int = 0, spec: SpecParams | None = None,
                  drafter: Any = None) -> Iterator[int]:
    """Yield sampled token ids until the context is full; the caller decides when to stop.
    `constraint` (edgeinfer.structured.SequenceConstraint) allows only the tokens its
    grammar does, and has accepted each token yielded. `n_past`: the slot's KV cache holds
    prompt[:n_past] already (a conversation's earlier turns); only the rest is processed.
    `spec`: speculative decoding (edgeinfer/spec/): drafted tokens are checked several per
    forward pass; the tokens are the same. `drafter` (with `extend(tokens)` and
    `draft(limit)`, given the prompt already) replaces spec's; spec's lengths still apply.
    When the caller stops, every token yielded but the last is in the cache."""
    tf = model.transformer
    n_prompt = len(prompt)
    check_prompt(n_prompt, tf.n_ctx)
    n_past = max(0, min(n_past, n_prompt - 1))  # the last prompt token gives the logits
    # The sampler's penalty window; -1 means every token so far.
    keep = sampler.params.repeat_last_n if sampler.params.repeat_last_n >= 0 else tf.n_ctx
    recent = list(prompt[len(prompt) - keep :]) if keep else []
    speculation = Speculation.start(spec, prompt, tf.n_batch, model.draft_model(spec), slot,
                                    drafter)
    n_rows = 1 + (speculation.n_max if speculation else 0)  # the last token, a draft
    logits = np.zeros((n_rows, model.config.n_vocab), dtype=np.float32)
    mask = None if constraint is None else constraint.new_mask()
    tokens, positions = np.zeros(n_rows, np.int32), np.zeros(n_rows, np.int32)
    slots, rows = np.full(n_rows, slot, np.int32), np.arange(n_rows, dtype=np.int32)
    t0 = time.perf_counter()
    ids = np.asarray(prompt[n_past:], dtype=np.int32)  # (n_new,)
    n_new = n_prompt - n_past
    tf.forward(ids, np.arange(n_past, n_prompt, dtype=np.int32),
               np.full(n_new, slot, np.int32), np.array([n_new - 1], np.int32), logits[:1])
    timings.prompt_n, timings.prompt_ms = n_new, 1e3 * (time.perf_counter() - t0)
    timings.cache_n = n_past
    t0 = time.perf_counter()
    p, draft = n_prompt, []  # p: the position of the next token yielded
    while True:
        for i in range(len(draft) + 1):  # row i of logits follows the draft's first i tokens
            next_id = sampler.sample(logits[i], recent)
            if constraint is not None and not constraint.allows(next_id):  # as the server
                constraint.fill_mask(mask)
                next_id = sampler.sample(logits[i], recent, mask)
            if constraint is not None and not constraint.accept(next_id):
                raise EdgeInferError(f"the constraint refused token {next_id}: "
                                     f"{constraint.error}")
            timings.predicted_n += 1
            timings.predicted_ms = 1e3 * (time.perf_counter() - t0)
            yield next_id
            if p == tf.n_ctx:
                return
            p += 1
            if keep:
                recent.append(next_id)
                if len(recent) > 4 * keep:  # trim now and then, not every step
                    del recent[:-keep]
            if speculation is not None:
                speculation.extend(next_id)
            if i == len(draft) or next_id != draft[i]:  # the first token not drafted
                break
        if speculation is not None:
            speculation.record(len(draft), i)
            timings.draft_n, timings.draft_n_accepted = speculation.drafted, speculation.accepted
            draft = speculation.propose(tf.n_ctx - p)
        n = len(draft) + 1  # next_id at p - 1, then the draft
        tokens[0], tokens[1:n] = next_id, draft
        np.add(rows[:n], p - 1, out=positions[:n])
        tf.forward(tokens[:n], positions[:n], slots[:n], rows[:n], logits[:n])


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


def stream_generate(model: Model, prompt: Sequence[int], sampler: Sampler,
                    max_tokens: int = -1, stop: Sequence[str] = (),
                    slot: int = 0, constraint: Any = None,
                    n_past: int = 0, spec: SpecParams | None = None
                    ) -> Iterator[GenerationEvent]:
    """Events with text pieces; the last one carries finish_reason and the timings.
    max_tokens < 0 means until EOS or the end of the context. With a `constraint`, the
    generation also stops where its grammar is complete. `n_past` and `spec` as
    generate_step's."""
    timings = Timings()
    decoder = model.tokenizer.stream_decoder()
    matcher = StopMatcher(stop)
    finish, hit, n = "length", False, 0
    for token in generate_step(model, prompt, sampler, timings, slot, constraint, n_past,
                               spec):
        if model.tokenizer.is_eog(token):
            finish = "stop"
            break
        n += 1
        text, hit = matcher.feed(decoder.feed(token))
        yield GenerationEvent(text, token, timings=timings)
        if hit or (constraint is not None and constraint.is_stopped()):
            finish = "stop"
            break
        if n == max_tokens:
            break
    tail = ""
    if not hit:  # emit what was held back: an incomplete character, a partial stop string
        tail, hit = matcher.feed(decoder.flush())
        tail += "" if hit else matcher.flush()
    yield GenerationEvent(tail, None, finish, timings)
