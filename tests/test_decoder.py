"""The per-sequence decoder (edgeinfer/decoder.py) on rows of logits made by the test: the
penalty window, limits, the context's end, stops, EOS, a refused token, a rejected draft and
the timings' two shapes."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_models import write_tiny_model

from edgeinfer.api import Model
from edgeinfer.decoder import ConstraintFault, SequenceDecoder, Timings
from edgeinfer.errors import ModelFault
from edgeinfer.sampling import make_sampler
from edgeinfer.sampling_params import SamplingParams

EOS = 2  # tiny_models' end-of-generation token


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("decoder") / "tiny.gguf")
    return Model.load(path, n_ctx=64, warm_up=False).tokenizer


def rows_for(*tokens: int, n_vocab: int = 267) -> np.ndarray:
    """One row per token, each preferring that token by far."""
    rows = np.zeros((len(tokens), n_vocab), np.float32)
    rows[np.arange(len(tokens)), tokens] = 20.0
    return rows


def decoder(tokenizer, prompt, n_ctx=64, sampling=SamplingParams(temperature=0), **kw):
    dec = SequenceDecoder(tokenizer, prompt, make_sampler(sampling), n_ctx, **kw)
    dec.prompt_done(1.0)
    return dec


def take(dec, *tokens: int) -> list:
    return [out for t in tokens for out in dec.step(rows_for(t), [], 2.0)]


@pytest.mark.parametrize("last_n,kept", [(-1, 5000), (3000, 3000), (0, 0), (64, 64)])
def test_penalty_window_keeps_what_was_asked(tokenizer, last_n, kept):
    prompt = (np.arange(5000) % 200 + 3).tolist()
    dec = decoder(tokenizer, prompt, n_ctx=8192,
                  sampling=SamplingParams(temperature=0, repeat_last_n=last_n))
    assert dec.recent == prompt[len(prompt) - kept:]
    for i in range(2500):
        take(dec, 3 + i % 100)
    seq = prompt + [3 + i % 100 for i in range(2500)]
    want = seq if last_n < 0 else seq[len(seq) - kept:] if kept else []
    assert dec.recent[len(dec.recent) - len(want):] == want and len(dec.recent) >= len(want)


def test_n_predict_zero_ends_at_the_prompt(tokenizer):
    dec = decoder(tokenizer, [5, 6, 7], n_predict=0)
    assert dec.finish.stop_type == "limit" and dec.n_decoded == 0


def test_the_token_after_the_last_cell_ends_the_sequence(tokenizer):
    """Cells 0..n_ctx-1: a token sampled for position n_ctx is shown, never fed."""
    dec = decoder(tokenizer, [5, 6, 7], n_ctx=6)
    take(dec, 40, 41, 42)  # positions 3, 4, 5
    assert dec.finish is None
    assert [o.token for o in take(dec, 43)] == [43]  # position 6
    assert dec.finish.stop_type == "limit" and dec.finish.truncated


def test_stops_and_eos(tokenizer):
    word = tokenizer.encode("ab", add_special=False)
    dec = decoder(tokenizer, [5, 6], stop=["ab"])
    outs = take(dec, *tokenizer.encode("xa", add_special=False))
    assert "".join(o.text for o in outs) == "x"  # "a" held back: it may start the stop
    take(dec, *tokenizer.encode("b", add_special=False))
    assert dec.finish.stop_type == "word" and dec.finish.word == "ab" and word
    dec = decoder(tokenizer, [5, 6], stop=["ab"])
    outs = take(dec, *tokenizer.encode("xa", add_special=False), EOS)
    assert "".join(o.text for o in outs) == "x" and EOS not in [o.token for o in outs]
    assert dec.finish.stop_type == "eos" and dec.finish.tail == "a"


class Refusing:
    """A constraint whose grammar refuses every token."""

    error = "nothing is allowed"

    def start(self):
        return self

    def allows(self, token):
        return True

    def accept(self, token):
        return False

    def accept_tokens(self, ids):
        return len(ids)


def test_a_refused_token_is_a_model_fault(tokenizer):
    dec = decoder(tokenizer, [5, 6], constraint=Refusing())
    with pytest.raises(ConstraintFault, match="refused token 9: nothing is allowed"):
        take(dec, 9)
    assert issubclass(ConstraintFault, ModelFault)  # the server answers it with a 500


class Drafting:
    """Speculation's interface with a fixed draft."""

    n_max, drafted, accepted = 3, 0, 0

    def __init__(self):
        self.seen = []

    def extend(self, token):
        self.seen.append(token)

    def propose(self, limit, n_seqs=1):
        return [50, 51, 52][:limit]

    def record(self, n_drafted, n_accepted):
        self.drafted += n_drafted
        self.accepted += n_accepted


def test_a_draft_is_kept_up_to_the_first_difference(tokenizer):
    spec = Drafting()
    dec = decoder(tokenizer, [5, 6], speculation=spec)
    draft = dec.propose()
    outs = list(dec.step(rows_for(50, 51, 60, 61), draft, 2.0))
    assert [o.token for o in outs] == [50, 51, 60] and dec.rows_used == 3
    assert dec.n_accepted == 2 and dec.last_token == 60 and dec.n_past == 5
    assert (dec.timings.draft_n, dec.timings.draft_n_accepted) == (3, 2)


def test_timings_round_trip():
    t = Timings(prompt_n=10, prompt_ms=20.0, cache_n=3, predicted_n=5, predicted_ms=40.0,
                draft_n=4, draft_n_accepted=2)
    d = t.as_dict()
    assert d["predicted_per_second"] == pytest.approx(1e3 * 4 / 40.0)  # decode steps
    assert d["prompt_per_second"] == pytest.approx(500.0)
    assert Timings.from_dict(d) == t
    assert "draft_n" not in Timings(predicted_n=1).as_dict()
