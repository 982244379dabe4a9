"""Speculative decoding (issue 39): prompt-lookup drafts checked in one forward pass give the
tokens plain decoding gives, greedy and seeded sampling alike, on tiny and real models; the
drafter matches llama.cpp's ngram-simple scan."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_models import Q, write_tiny_model

from edgeinfer.api import Model
from edgeinfer.errors import EdgeInferError
from edgeinfer.generate import generate_step, start_decoder, stream_generate
from edgeinfer.sampling import make_sampler
from edgeinfer.sampling_params import SamplingParams
from edgeinfer.spec import DraftLength, NgramSimple, SpecParams
from edgeinfer.tiles import fills_tiles


def llama_ngram_simple(tokens: list[int], sampled: int, n: int, m: int) -> list[int]:
    """common_ngram_simple_draft (llama.cpp common/ngram-map.cpp), line for line."""
    cur = len(tokens)
    if cur <= n + m + 1:
        return []
    pattern = tokens[cur - n + 1:] + [sampled]
    match = 0
    for j in range(cur - n - 1, 0, -1):
        if tokens[j:j + n] == pattern:
            match = j
            break
    if match == 0:
        return []
    copy_max = min(m, cur - (match + n))
    if copy_max < n:
        return []
    return tokens[match + n: match + n + copy_max]


@pytest.mark.parametrize("n,m", [(1, 1), (2, 4), (3, 8), (4, 3)])
def test_ngram_simple_drafts_as_llama_cpp(n, m):
    rng = np.random.default_rng(n * 10 + m)
    for _ in range(200):
        seq = rng.integers(0, 4, int(rng.integers(1, 60))).tolist()  # few symbols: repeats
        drafter = NgramSimple(n, m, seq[:1])
        for i in range(1, len(seq)):
            drafter.extend(seq[i:i + 1])
            want = llama_ngram_simple(seq[:i], seq[i], n, m)
            assert drafter.draft(m) == want, (seq[: i + 1], n, m)
            assert drafter.draft(2) == want[:2]


def test_draft_length_adapts():
    length = DraftLength(n_min=2, n_max=16)
    assert length.k == 16
    length.record(16, 3)  # rejected at the fourth: check four next time
    assert length.k == 4
    length.record(4, 4)
    assert length.k == 8
    length.record(8, 0)
    assert length.k == 2  # not below n_min, or nothing would be checked again
    assert length.usable([5, 6, 7]) == [5, 6] and length.usable([5]) == []  # under n_min
    assert (length.drafted, length.accepted) == (28, 7)


def test_drafts_fill_whole_tiles():
    """A check of k drafts runs k + 1 rows; the kernels pad rows to tiles of 1, 2, 4, 8 and
    multiples of 8, so a draft is cut to the longest that pads nothing."""
    length = DraftLength(n_min=0, n_max=40)
    for n in range(1, 41):
        got = len(length.usable(list(range(n))))
        assert fills_tiles(got + 1) and got <= n
        assert not any(fills_tiles(k + 1) for k in range(got + 1, n + 1))
    assert fills_tiles(16) and fills_tiles(24) and not fills_tiles(12)
    assert len(DraftLength(n_min=5, n_max=16).usable(list(range(6)))) == 5  # n_min first


def test_batch_drafts_need_a_high_acceptance():
    length = DraftLength(n_min=0, n_max=16)
    assert length.worth(1) and length.worth(8)  # nothing rejected yet
    for _ in range(4):
        length.record(8, 1)  # one of two compared tokens kept: rate near 0.5
    assert length.worth(1) and length.worth(2)  # alone, or nearly: drafting pays
    assert not length.worth(8)  # in a batch of 8 a plain row costs less per token
    assert any(length.worth(8) for _ in range(40))  # skipped sequences are tried again
    for _ in range(6):
        length.record(8, 8)
    assert length.worth(8)


def test_bad_spec_params_are_refused():
    with pytest.raises(EdgeInferError, match="unknown --spec-type 'eagle'"):
        SpecParams("eagle")
    with pytest.raises(EdgeInferError, match="must be >= 0"):
        SpecParams("ngram-simple", n_max=-1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("spec") / "tiny.gguf", "llama", Q.Q8_0,
                            n_ctx_train=1024)
    return Model.load(path, n_ctx=512, warm_up=False)


def tokens_of(model, prompt, sampling: SamplingParams, n: int, spec=None, drafter=None,
              ignore_eos: bool = False):
    bias = tuple((t, float("-inf")) for t in model.tokenizer.eog_ids) if ignore_eos else ()
    decoder = start_decoder(model, prompt, make_sampler(sampling, bias), n, spec=spec,
                            drafter=drafter)
    decoder.ignore_eos = ignore_eos
    return [out.token for out in generate_step(model, decoder)], decoder.timings


NGRAM = SpecParams("ngram-simple", n_max=8, ngram_size_n=2, ngram_size_m=8)


def repetitive_prompts(rng, count: int) -> list[list[int]]:
    """Prompts that repeat phrases, as text to rewrite or quote does."""
    prompts = []
    for _ in range(count):
        phrases = [rng.integers(3, 250, int(rng.integers(3, 9))).tolist() for _ in range(3)]
        prompt = []
        for _ in range(int(rng.integers(3, 7))):
            prompt += phrases[int(rng.integers(0, 3))]
        prompts.append(prompt)
    return prompts


class Oracle:
    """Drafts the tokens plain decoding gave, each wrong with probability `noise` (and from
    there on): every accepted length, every rejection point and full acceptance occur."""

    def __init__(self, prompt, truth, noise: float, seed: int):
        self.n0, self.truth, self.hist = len(prompt), truth, list(prompt)
        self.noise, self.rng = noise, np.random.default_rng(seed)

    def extend(self, tokens):
        self.hist.extend(tokens)

    def draft(self, limit: int) -> list[int]:
        done = len(self.hist) - self.n0
        out = list(self.truth[done:done + limit])
        for i in range(len(out)):
            if self.rng.random() < self.noise:
                out[i] = (out[i] + 1) % 200
                break
        return out


@pytest.mark.parametrize("sampling", [
    SamplingParams(temperature=0),
    SamplingParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.1),
], ids=["greedy", "seeded"])
def test_checked_drafts_give_plain_tokens(tiny, sampling):
    """Each position is sampled from the same logits with the same random draws as plain
    decoding, so greedy and seeded samples are the same tokens (the distribution is
    unchanged), whatever the drafts and wherever they are rejected."""
    rng = np.random.default_rng(0)
    drafted = accepted = full = 0
    for seed in range(30):
        prompt = rng.integers(3, 250, int(rng.integers(4, 40))).tolist()
        params = SamplingParams(**{**sampling.__dict__, "seed": seed})
        plain, _ = tokens_of(tiny, prompt, params, 60)
        oracle = Oracle(prompt, plain, noise=0.15, seed=seed)
        spec, t = tokens_of(tiny, prompt, params, 60, SpecParams("ngram-simple", n_max=8),
                            oracle)
        assert spec == plain
        drafted, accepted = drafted + t.draft_n, accepted + t.draft_n_accepted
        full += t.draft_n == t.draft_n_accepted
    assert 0 < accepted < drafted and full < 30  # drafts kept whole, in part and not at all


def test_ngram_drafts_on_repetitive_prompts_give_plain_tokens(tiny):
    greedy = SamplingParams(temperature=0)
    drafted = 0
    for prompt in repetitive_prompts(np.random.default_rng(0), 24):
        plain, _ = tokens_of(tiny, prompt, greedy, 80)
        spec, t = tokens_of(tiny, prompt, greedy, 80, NGRAM)
        assert spec == plain
        drafted += t.draft_n
    assert drafted > 0


def test_limits_and_stops_at_draft_boundaries(tiny):
    greedy = SamplingParams(temperature=0)
    prompt = repetitive_prompts(np.random.default_rng(2), 1)[0]
    full = [e.text for e in stream_generate(tiny, prompt, make_sampler(greedy), 60)]
    text = "".join(full)
    for n in range(1, 40, 3):  # every length, wherever a draft ends
        plain = "".join(e.text for e in stream_generate(tiny, prompt, make_sampler(greedy), n))
        spec = "".join(e.text for e in stream_generate(tiny, prompt, make_sampler(greedy), n,
                                                       spec=NGRAM))
        assert spec == plain
    stop = text[len(text) // 2: len(text) // 2 + 3]
    events = list(stream_generate(tiny, prompt, make_sampler(greedy), 60, [stop], spec=NGRAM))
    assert "".join(e.text for e in events) == text[: text.index(stop)]
    assert events[-1].finish_reason == "stop"


def test_context_end_with_drafts(tiny):
    """Drafts never run past the context: the same tokens up to its last cell."""
    model = Model.load(tiny.path, n_ctx=96, warm_up=False)
    greedy = SamplingParams(temperature=0)
    prompt = repetitive_prompts(np.random.default_rng(3), 1)[0]
    plain, _ = tokens_of(model, prompt, greedy, 1000, ignore_eos=True)
    spec, _ = tokens_of(model, prompt, greedy, 1000, NGRAM, ignore_eos=True)
    assert spec == plain and len(plain) == 96 - len(prompt) + 1


INPUT_GROUNDED = (
    "Repeat the following sentence exactly: The quick brown fox jumps over the lazy dog "
    "while the farmer watches from the old wooden fence near the red barn.",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"
    "Rewrite the two functions above with type hints:\n",
)


@pytest.mark.parametrize("filename", ["SmolLM2-135M-Instruct.Q4_1.gguf",
                                      "gemma-3-270m-q4_k_m.gguf"])
def test_real_models_greedy_tokens_unchanged(real_model, filename):
    model = Model.load(real_model(filename), n_ctx=512, warm_up=False)
    greedy = SamplingParams(temperature=0)
    accepted = 0
    for text in INPUT_GROUNDED:
        prompt = model.tokenize(text)
        plain, _ = tokens_of(model, prompt, greedy, 48)
        spec, t = tokens_of(model, prompt, greedy, 48, SpecParams("ngram-simple",
                                                                   ngram_size_n=3))
        assert spec == plain
        accepted += t.draft_n_accepted
    assert accepted > 0
