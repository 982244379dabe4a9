"""Generation layers: stop strings, max tokens, finish reasons, seeds."""

from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as Q
from tiny_models import write_tiny_model

from edgeinfer.api import Model
from edgeinfer.generate import StopMatcher, stream_generate
from edgeinfer.sampling import SamplingParams, make_sampler


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("gen") / "tiny.gguf", "llama", Q.Q8_0)
    return Model.load(path, n_ctx=64)


def greedy():
    return make_sampler(SamplingParams(temperature=0))


def test_stop_matcher_holds_back_partial_matches():
    m = StopMatcher(["STOP"])
    assert m.feed("abc ST") == ("abc ", False)
    assert m.feed("O") == ("", False)
    assert m.feed("P and more") == ("", True)
    m = StopMatcher(["STOP"])
    assert m.feed("abc ST") == ("abc ", False)
    assert m.feed("X") == ("STX", False)


def test_stop_string_cuts_the_text(model):
    ids = model.tokenize("the cat")
    full = "".join(e.text for e in stream_generate(model, ids, greedy(), 20))
    stop = full[5:8]
    assert stop and full.index(stop) >= 5
    events = list(stream_generate(model, ids, greedy(), 20, stop=[stop]))
    text = "".join(e.text for e in events)
    assert text == full[: full.index(stop)]
    assert events[-1].finish_reason == "stop"


def test_max_tokens_and_length_finish(model):
    events = list(stream_generate(model, model.tokenize("the cat"), greedy(), 5))
    assert sum(e.token is not None for e in events) == 5
    assert events[-1].finish_reason == "length"
    assert events[-1].timings.predicted_n == 5


def test_generation_stops_at_the_end_of_the_context(model):
    prompt = model.tokenize("the cat")
    events = list(stream_generate(model, prompt, greedy(), -1))
    assert sum(e.token is not None for e in events) <= 64 - len(prompt) + 1
    assert events[-1].finish_reason in ("length", "stop")


def test_seeded_sampling_is_reproducible(model):
    def run(seed):
        return "".join(model.generate("the cat", max_tokens=12, temperature=1.5, seed=seed))

    assert run(3) == run(3)
    assert len({run(s) for s in range(4)}) > 1


def test_repeat_penalty_window_longer_than_64(model):
    """--repeat-last-n beyond 64 sees that many tokens (the history is not cut to 64)."""
    seen = []

    class Spy:
        params = SamplingParams(temperature=0, repeat_penalty=1.1, repeat_last_n=100)

        def sample(self, logits, recent):
            seen.append(len(recent))
            return int(logits.argmax())

    big = Model.load(model.path, n_ctx=256)
    prompt = big.tokenize("the cat " * 30)
    assert len(prompt) > 64
    list(stream_generate(big, prompt, Spy(), 5))
    assert seen[0] == 100 and min(seen) >= 100  # the sampler reads the last 100 of them
