"""Generation in three layers; only the CLI (outermost) prints.

- `generate_step` runs one sequence's forward passes (the prompt in one batched forward, then
  a token and its draft per step, into preallocated buffers) around its `SequenceDecoder`
  (edgeinfer/decoder.py: sampling, constraint, speculation, text, stops, timings, the code
  the server's engine runs for each sequence of its batch) and yields the tokens it takes.
- `stream_generate` turns them into `GenerationEvent`s: text pieces that never split a UTF-8
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

from edgeinfer.decoder import SequenceDecoder, StopMatcher, Timings, TokenText
from edgeinfer.errors import EdgeInferError
from edgeinfer.spec import SpecParams
from edgeinfer.spec.speculation import Speculation

__all__ = ["GenerationEvent", "StopMatcher", "Timings", "generate_step", "start_decoder",
           "stream_generate"]

if TYPE_CHECKING:
    from edgeinfer.api import Model
    from edgeinfer.sampling import Sampler


@dataclass
class GenerationEvent:
    text: str  # new text since the previous event (may be "")
    token: int | None  # the token that produced it; None on the final event
    finish_reason: str | None = None  # "stop" (EOS or stop string) or "length"
    timings: Timings = field(default_factory=Timings)


FINISH_REASONS = {"eos": "stop", "word": "stop", "limit": "length"}  # llama.cpp's -> OpenAI's


def check_prompt(n_prompt: int, n_ctx: int) -> None:
    if n_prompt == 0:
        raise EdgeInferError("empty prompt: nothing to generate from")
    if n_prompt >= n_ctx:
        raise EdgeInferError(
            f"prompt is too long ({n_prompt} tokens) for the context size ({n_ctx} tokens); "
            "use a larger -c/--ctx-size or a shorter prompt"
        )


def start_decoder(model: Model, prompt: Sequence[int], sampler: Sampler,
                  max_tokens: int = -1, stop: Sequence[str] = (), slot: int = 0,
                  constraint: Any = None, n_past: int = 0, spec: SpecParams | None = None,
                  drafter: Any = None) -> SequenceDecoder:
    """The decoder of one sequence in `slot`, whose KV cache holds prompt[:n_past] already
    (a conversation's earlier turns; the last prompt token is always processed again for
    its logits). `constraint`: a compiled grammar (Model.compile_constraint). `spec`:
    speculative decoding (edgeinfer/spec/); `drafter` (with `extend(tokens)` and
    `draft(limit)`, given the prompt already) replaces spec's, spec's lengths still apply."""
    tf = model.transformer
    check_prompt(len(prompt), tf.n_ctx)
    n_past = max(0, min(n_past, len(prompt) - 1))
    speculation = Speculation.start(spec, prompt, tf.n_batch, model.draft_model(spec), slot,
                                    drafter)
    return SequenceDecoder(model.tokenizer, prompt, sampler, tf.n_ctx, n_predict=max_tokens,
                           stop=stop, constraint=constraint, speculation=speculation,
                           n_cached=n_past, now=time.perf_counter())


def generate_step(model: Model, decoder: SequenceDecoder, slot: int = 0) -> Iterator[TokenText]:
    """Run the forward passes of decoder's sequence in `slot` and yield each token it takes
    (with its text) until it finishes: the prompt's tokens not in the cache, then each step
    the last token and its draft. When the caller stops early, every token yielded but the
    last is in the cache."""
    tf = model.transformer
    prompt, n_past = decoder.prompt, decoder.n_cached
    n_rows = 1 + decoder.n_draft_max  # the last token, a draft
    logits = np.zeros((n_rows, model.config.n_vocab), dtype=np.float32)
    tokens, positions = np.zeros(n_rows, np.int32), np.zeros(n_rows, np.int32)
    slots, rows = np.full(n_rows, slot, np.int32), np.arange(n_rows, dtype=np.int32)
    n_new = len(prompt) - n_past
    tf.forward(np.asarray(prompt[n_past:], dtype=np.int32),  # (n_new,)
               np.arange(n_past, len(prompt), dtype=np.int32), np.full(n_new, slot, np.int32),
               np.array([n_new - 1], np.int32), logits[:1])
    decoder.prompt_done(time.perf_counter())
    draft: list[int] = []
    while decoder.finish is None:
        yield from decoder.step(logits[: len(draft) + 1], draft, time.perf_counter())
        if decoder.finish is not None:
            return
        draft = decoder.propose()
        n = len(draft) + 1  # the last token at n_past - 1, then the draft
        tokens[0], tokens[1:n] = decoder.last_token, draft
        np.add(rows[:n], decoder.n_past - 1, out=positions[:n])
        tf.forward(tokens[:n], positions[:n], slots[:n], rows[:n], logits[:n])


def stream_generate(model: Model, prompt: Sequence[int], sampler: Sampler,
                    max_tokens: int = -1, stop: Sequence[str] = (),
                    slot: int = 0, constraint: Any = None,
                    n_past: int = 0, spec: SpecParams | None = None
                    ) -> Iterator[GenerationEvent]:
    """Events with text pieces; the last one carries finish_reason and the timings.
    max_tokens < 0 means until EOS or the end of the context. With a `constraint`, the
    generation also stops where its grammar is complete. The arguments as start_decoder's."""
    decoder = start_decoder(model, prompt, sampler, max_tokens, stop, slot, constraint,
                            n_past, spec)
    for out in generate_step(model, decoder, slot):
        yield GenerationEvent(out.text, out.token, timings=decoder.timings)
    finish = decoder.finish
    yield GenerationEvent(finish.tail, None, FINISH_REASONS[finish.stop_type],
                          decoder.timings)
