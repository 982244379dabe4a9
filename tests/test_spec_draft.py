"""Speculative decoding with a draft model (issue 39, llama.cpp's draft-simple) and the
output distribution under sampling: a draft model of the same vocabulary gives the tokens
plain decoding gives; one of another vocabulary is a one-line error at load; sampled outputs
with speculation follow the plain distribution (a chi-square test that fails for a small
change of temperature)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from scipy.stats import chi2_contingency
from tiny_models import Q, write_tiny_model

from edgeinfer.api import Model
from edgeinfer.decoder import SequenceDecoder
from edgeinfer.errors import EdgeInferError
from edgeinfer.generate import generate_step, start_decoder
from edgeinfer.sampling import make_sampler
from edgeinfer.sampling_params import SamplingParams
from edgeinfer.spec import SpecParams
from edgeinfer.spec.draft_model import DraftModel, vocab_mismatch
from edgeinfer.spec.params import spec_params


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny target and a smaller draft with the same vocabulary, different weights."""
    root = tmp_path_factory.mktemp("draft")
    target = write_tiny_model(root / "target.gguf", "llama", Q.Q8_0, seed=1, n_ctx_train=1024)
    draft = write_tiny_model(root / "draft.gguf", "llama", Q.Q8_0, seed=2, n_ctx_train=1024,
                             n_layer=1, n_embd=128, n_ff=256, n_head=2, n_kv=1)
    return Model.load(target, n_ctx=256, warm_up=False), str(target), str(draft)


def run(model, prompt, sampling, n, spec=None):
    decoder = start_decoder(model, prompt, make_sampler(sampling), n, spec=spec)
    return [out.token for out in generate_step(model, decoder)], decoder.timings


@pytest.mark.parametrize("sampling", [
    SamplingParams(temperature=0),
    SamplingParams(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0),
], ids=["greedy", "seeded"])
def test_draft_model_gives_plain_tokens(pair, sampling):
    model, _, draft = pair
    rng = np.random.default_rng(5)
    drafted = 0
    for seed in range(12):
        prompt = rng.integers(3, 250, int(rng.integers(3, 30))).tolist()
        params = SamplingParams(**{**sampling.__dict__, "seed": seed})
        plain, _ = run(model, prompt, params, 40)
        spec, t = run(model, prompt, params, 40,
                      SpecParams("draft-simple", n_max=4, draft_model=draft))
        assert spec == plain
        drafted += t.draft_n
    assert drafted > 0


def test_target_drafting_for_itself_is_accepted_whole(pair):
    model, target, _ = pair
    prompt = list(range(10, 30))
    plain, _ = run(model, prompt, SamplingParams(temperature=0), 50)
    spec, t = run(model, prompt, SamplingParams(temperature=0), 50,
                  SpecParams("draft-simple", n_max=6, draft_model=target))
    assert spec == plain
    assert t.draft_n > 20 and t.draft_n_accepted == t.draft_n


def test_p_min_stops_unsure_drafts(pair):
    """A random tiny draft model is never 99.99 % sure: nothing is drafted."""
    model, _, draft = pair
    _, t = run(model, list(range(5, 25)), SamplingParams(temperature=0), 30,
               SpecParams("draft-simple", n_max=4, draft_model=draft, p_min=0.9999))
    assert t.draft_n == 0


def test_draft_cells_follow_rollbacks(pair):
    """The draft model's cache is caught up on what was accepted, past rejected drafts:
    its next logits equal a fresh model's on the same history."""
    model, _, draft = pair
    dm = DraftModel(Model.load(draft, n_ctx=256, warm_up=False), model.tokenizer, 256)
    history = list(range(20, 50))
    dm.propose(0, history[:20], 5, 0.0)  # drafts 5 cells past 20, most of them wrong
    dm.propose(0, history, 3, 0.0)
    fresh = Model.load(draft, n_ctx=256, warm_up=False)
    want = fresh.logits(history, rows=[len(history) - 1])[0]
    dm.catch_up(0, history)
    np.testing.assert_allclose(dm.logits[0], want, rtol=1e-5, atol=1e-5)


def tok(kind="bpe", n=300, texts=None, bos=1, eos=2):
    texts = texts or [f"t{i}" for i in range(n)]
    return SimpleNamespace(kind=kind, add_bos=True, bos_id=bos, add_eos=False, eos_id=eos,
                           n_vocab=len(texts), token_text=texts.__getitem__)


def test_vocab_checks_as_llama_cpp():
    assert vocab_mismatch(tok(), tok()) is None
    assert vocab_mismatch(tok(), tok(n=300 + 128)) is None  # llama.cpp allows 128 more
    assert "tokens against" in vocab_mismatch(tok(), tok(n=300 + 129))
    assert "vocabulary type spm" in vocab_mismatch(tok(), tok("spm"))
    assert "BOS" in vocab_mismatch(tok(), tok(bos=3))
    texts = [f"t{i}" for i in range(300)]
    texts[77] = "other"
    assert "token 77" in vocab_mismatch(tok(), tok(texts=texts))
    texts = [f"t{i}" for i in range(300)]
    texts[3] = "other"  # below llama.cpp's first checked id
    assert vocab_mismatch(tok(), tok(texts=texts)) is None


def test_spec_flags():
    assert spec_params("none", "d.gguf").type == "draft-simple"  # -md alone
    with pytest.raises(EdgeInferError, match="draft-simple needs a draft model"):
        spec_params("draft-simple")
    with pytest.raises(EdgeInferError, match="not ngram-simple"):
        spec_params("ngram-simple", "d.gguf")
    with pytest.raises(EdgeInferError, match="p-min"):
        spec_params("ngram-simple", p_min=1.5)


def test_other_vocabulary_is_refused_at_load(real_model):
    smol = Model.load(real_model("SmolLM2-135M-Instruct.Q4_1.gguf"), n_ctx=256,
                      warm_up=False)
    gemma = real_model("gemma-3-270m-q4_k_m.gguf")
    with pytest.raises(EdgeInferError, match="cannot draft for this model: vocabulary type"):
        smol.draft_model(SpecParams("draft-simple", draft_model=str(gemma)))


class Recording(SequenceDecoder):
    """The real rule; counts the tokens sampled from a row after accepted drafted tokens."""

    after_drafts = 0

    def _choose(self, row, drafted, after):
        Recording.after_drafts += after > 0
        return super()._choose(row, drafted, after)


class GreedyAfterDrafts(SequenceDecoder):
    """A biased rule: after an accepted drafted token, the next draft is kept whenever it is
    the row's most likely token, instead of sampling the row."""

    def _choose(self, row, drafted, after):
        if after > 0 and drafted is not None and drafted == int(row.argmax()):
            self.sampler.sample(row, self.recent)  # the same random draws
            return drafted, None
        return super()._choose(row, drafted, after)


def later_tokens(model, prompts, sampling, seeds, spec, rule=SequenceDecoder):
    """The third and fourth generated tokens (as (position, token)) for each prompt and
    seed: with a draft model drafting for itself, often sampled from rows after accepted
    drafted tokens (the first token comes from the prompt's logits, the second from the row
    the first draft is checked on)."""
    out = []
    for prompt in prompts:
        for seed in seeds:
            params = SamplingParams(**{**sampling.__dict__, "seed": seed})
            decoder = start_decoder(model, prompt, make_sampler(params), 8, spec=spec)
            decoder.__class__ = rule  # the rule under test, on the same state
            tokens = [o.token for o in generate_step(model, decoder)]
            out += [(2, tokens[2]), (3, tokens[3])] if len(tokens) >= 4 else []
    return out


def p_value(a, b) -> float:
    """Chi-square test that samples a and b come from one distribution."""
    cats = sorted(set(a) | set(b))
    table = np.array([[a.count(c) for c in cats], [b.count(c) for c in cats]])
    table = table[:, table.sum(0) >= 10]  # sparse categories left out
    return chi2_contingency(table)[1]


def test_sampled_output_distribution_is_unchanged(pair):
    """Tokens sampled after accepted drafts (the target drafting for itself) follow the
    plain distribution: samples with speculation and without, from disjoint seeds, pass a
    chi-square test, while a rule biased only after accepted drafts fails it, and so does
    plain sampling at temperature 0.8 instead of 1.0."""
    model, target, _ = pair
    sampling = SamplingParams(temperature=1.0, top_k=6, top_p=1.0, min_p=0.0)
    prompts = [[10, 11, 12, 13], [40, 41, 40, 41, 40]]
    spec = SpecParams("draft-simple", n_max=3, p_min=0.0, draft_model=target)  # whole drafts
    plain = later_tokens(model, prompts, sampling, range(0, 1200), None)
    Recording.after_drafts = 0
    specd = later_tokens(model, prompts, sampling, range(5000, 6200), spec, Recording)
    assert Recording.after_drafts > len(specd) // 4  # many came after accepted drafts
    biased = later_tokens(model, prompts, sampling, range(5000, 6200), spec,
                          GreedyAfterDrafts)
    colder = SamplingParams(**{**sampling.__dict__, "temperature": 0.8})
    shifted = later_tokens(model, prompts, colder, range(9000, 10200), None)
    assert p_value(plain, specd) > 0.001
    assert p_value(plain, biased) < 0.001
    assert p_value(plain, shifted) < 0.001


def test_run_speculates_with_the_same_text(pair):
    """`edgeinfer run` with either drafter prints the plain text and llama.cpp's acceptance
    line; a draft model of another vocabulary is one line and exit code 1."""
    from test_cli import edgeinfer

    _, target, draft = pair
    base = ("run", target, "-p", "abc abc abc", "-n", 24, "--temp", 0, "--raw", "-c", 256,
            "--local")
    plain = edgeinfer(*base)
    assert plain.returncode == 0, plain.stderr
    for extra in (("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", 1),
                  ("-md", draft, "--spec-draft-n-max", 3)):
        out = edgeinfer(*base, *extra)
        assert out.returncode == 0, out.stderr
        assert out.stdout == plain.stdout
    assert "draft acceptance rate" in out.stderr  # the draft model always drafts


def test_run_refuses_a_draft_of_another_vocabulary(pair, real_model):
    from test_cli import edgeinfer

    gemma = real_model("gemma-3-270m-q4_k_m.gguf")
    out = edgeinfer("run", pair[1], "-p", "hi", "-n", 2, "--local", "-md", gemma)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().count("\n") == 0 and "cannot draft for this model" in out.stderr
