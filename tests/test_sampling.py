"""Sampling against an independent, brute-force reference of llama.cpp's chain."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from edgeinfer.errors import EdgeInferError
from edgeinfer.sampling import (
    SamplingParams,
    apply_penalties,
    make_sampler,
    nucleus_candidates,
    top_k_candidates,
    top_logprobs,
    top_p_keep,
    top_probs,
)


def reference_distribution(
    logits: np.ndarray, recent: list[int], params: SamplingParams, logit_bias=()
) -> dict[int, float]:
    """llama.cpp's chain written the slow, obvious way: token id -> probability."""
    x = [float(v) for v in logits]
    for token, bias in logit_bias:  # llama_sampler_logit_bias: before the chain
        x[token] += bias
    window = recent if params.repeat_last_n == -1 else recent[-params.repeat_last_n :]
    if params.repeat_last_n == 0:
        window = []
    for token, count in Counter(window).items():
        x[token] = (
            x[token] / params.repeat_penalty if x[token] > 0 else x[token] * params.repeat_penalty
        )
        x[token] -= count * params.frequency_penalty + params.presence_penalty
    order = sorted(range(len(x)), key=lambda i: -x[i])
    if 0 < params.top_k < len(x):
        order = order[: params.top_k]
    if params.top_p < 1.0:
        total = sum(math.exp(x[i]) for i in order)
        cumulative = 0.0
        for j, i in enumerate(order):
            cumulative += math.exp(x[i]) / total
            if cumulative >= params.top_p:
                order = order[: j + 1]
                break
    if params.min_p > 0.0:
        best = max(x[i] for i in order)
        order = [i for i in order if math.exp(x[i] - best) >= params.min_p]
    weights = [math.exp(x[i] / params.temperature) for i in order]
    return {i: w / sum(weights) for i, w in zip(order, weights, strict=True)}


def empirical(logits: np.ndarray, recent: list[int], params: SamplingParams, n: int,
              logit_bias=()) -> Counter:
    sampler = make_sampler(params, logit_bias)
    return Counter(sampler.sample(logits, recent) for _ in range(n))


def chi_square(observed: Counter, expected: dict[int, float], n: int) -> float:
    return sum((observed.get(i, 0) - n * p) ** 2 / (n * p) for i, p in expected.items())


def random_logits(seed: int, n_vocab: int = 12, scale: float = 2.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n_vocab) * scale).astype(np.float32)


def test_defaults_are_llama_cpp():
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.min_p) == (0.8, 40, 0.95, 0.05)
    assert (p.repeat_penalty, p.repeat_last_n, p.presence_penalty, p.frequency_penalty) == (
        1.0,
        64,
        0.0,
        0.0,
    )
    assert p.seed is None


@pytest.mark.parametrize("temperature", [0.0, -1.0])
def test_greedy_is_argmax(temperature):
    sampler = make_sampler(SamplingParams(temperature=temperature, seed=1))
    for seed in range(50):
        logits = random_logits(seed, n_vocab=1000)
        assert sampler.sample(logits, []) == int(np.argmax(logits))


def test_greedy_sees_penalties():
    logits = np.array([1.0, 3.0, 2.9, -1.0], dtype=np.float32)
    sampler = make_sampler(SamplingParams(temperature=0.0, repeat_penalty=1.1))
    assert sampler.sample(logits, []) == 1
    assert sampler.sample(logits, [1]) == 2  # 3.0 / 1.1 < 2.9


def test_top_k_one_is_greedy():
    sampler = make_sampler(SamplingParams(temperature=1.5, top_k=1, top_p=1.0, min_p=0.0, seed=3))
    for seed in range(50):
        logits = random_logits(seed, n_vocab=500)
        assert sampler.sample(logits, []) == int(np.argmax(logits))


def test_same_seed_same_tokens_and_reset_replays():
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1234)
    logits = random_logits(7, n_vocab=64, scale=0.5)
    first = make_sampler(params)
    a = [first.sample(logits, []) for _ in range(100)]
    second = make_sampler(params)
    assert a == [second.sample(logits, []) for _ in range(100)]
    first.reset()
    assert a == [first.sample(logits, []) for _ in range(100)]
    other = make_sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=99))
    assert a != [other.sample(logits, []) for _ in range(100)]


def test_no_seed_draws_one_and_keeps_it():
    params = SamplingParams(temperature=1.0, seed=None)
    sampler = make_sampler(params)
    assert isinstance(sampler.seed, int)
    logits = random_logits(0, n_vocab=64, scale=0.3)
    a = [sampler.sample(logits, []) for _ in range(50)]
    replay = make_sampler(SamplingParams(temperature=1.0, seed=sampler.seed))
    assert a == [replay.sample(logits, []) for _ in range(50)]


CHAINS = [
    SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=11),
    SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.2, seed=12),
    SamplingParams(temperature=1.0, top_k=0, top_p=0.7, min_p=0.0, seed=13),
    SamplingParams(temperature=0.7, top_k=8, top_p=0.9, min_p=0.05, seed=14),
    SamplingParams(temperature=1.3, top_k=5, top_p=0.95, min_p=0.1, seed=15),
    SamplingParams(
        temperature=1.0,
        top_k=0,
        top_p=0.9,
        min_p=0.0,
        repeat_penalty=1.5,
        presence_penalty=0.5,
        frequency_penalty=0.25,
        repeat_last_n=4,
        seed=16,
    ),
    SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.01, seed=17),
    SamplingParams(temperature=0.8, top_k=6, top_p=0.95, min_p=0.05, repeat_penalty=1.3,
                   seed=18),
]
BIASES = {  # CHAINS[i] runs with these logit biases
    17: ((2, 1.5), (4, -math.inf), (2, 0.5), (9, -3.0)),
    18: ((0, -math.inf), (3, 2.0), (11, 4.0)),
}


@pytest.mark.parametrize("params", CHAINS, ids=range(len(CHAINS)))
def test_distribution_matches_reference(params):
    logits = random_logits(params.seed, n_vocab=12, scale=1.5)
    recent = [0, 3, 3, 5, 0, 3, 7]
    bias = BIASES.get(params.seed, ())
    expected = reference_distribution(logits, recent, params, bias)
    n = 20_000
    observed = empirical(logits, recent, params, n, bias)
    assert set(observed) <= set(expected), "sampled a token the chain filters out"
    # Allowed tokens with any real mass all appear; frequencies agree with the reference
    # (chi-square with <= 11 degrees of freedom: 40 is far beyond the 0.001 quantile).
    assert {i for i, p in expected.items() if p > 0.005} <= set(observed)
    assert chi_square(observed, expected, n) < 40.0


def test_min_p_allowed_set_is_exact():
    logits = np.log(np.array([0.4, 0.3, 0.15, 0.1, 0.05], dtype=np.float32))
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.3, seed=5)
    # Keeps tokens with p >= 0.3 * 0.4 = 0.12.
    assert set(empirical(logits, [], params, 2000)) == {0, 1, 2}


def test_top_p_allowed_set_is_exact():
    logits = np.log(np.array([0.4, 0.3, 0.15, 0.1, 0.05], dtype=np.float32))
    params = SamplingParams(temperature=1.0, top_k=0, top_p=0.8, min_p=0.0, seed=5)
    # Cumulative mass 0.4, 0.7, 0.85: the token that crosses 0.8 is kept.
    assert set(empirical(logits, [], params, 2000)) == {0, 1, 2}


def test_repeat_penalty_semantics():
    logits = np.array([2.0, -2.0, 0.0, 4.0, 1.0], dtype=np.float32)
    params = SamplingParams(
        repeat_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25, repeat_last_n=3
    )
    penalized = logits.copy()
    # Window is the last 3 tokens: [0, 1, 0]; token 3 is outside it.
    apply_penalties(penalized, [3, 0, 1, 0], params)
    expected = np.array(
        [2.0 / 2.0 - 2 * 0.5 - 0.25, -2.0 * 2.0 - 0.5 - 0.25, 0.0, 4.0, 1.0], dtype=np.float32
    )
    np.testing.assert_allclose(penalized, expected)


def test_zero_logit_is_multiplied_and_window_options():
    logits = np.array([0.0, 1.0, 3.0], dtype=np.float32)
    penalized = logits.copy()
    apply_penalties(penalized, [0, 2], SamplingParams(repeat_penalty=1.5, repeat_last_n=-1))
    np.testing.assert_allclose(penalized, [0.0, 1.0, 2.0])
    assert not SamplingParams(repeat_penalty=1.5, repeat_last_n=0).penalties_active
    assert not SamplingParams().penalties_active


def test_sample_leaves_caller_logits_alone():
    logits = random_logits(1, n_vocab=262_144)
    before = logits.copy()
    sampler = make_sampler(SamplingParams(repeat_penalty=1.3, seed=0))
    token = sampler.sample(logits, list(range(100)))
    assert 0 <= token < logits.shape[0]
    np.testing.assert_array_equal(logits, before)


def test_top_logprobs_matches_log_softmax():
    logits = random_logits(2, n_vocab=50)
    x = logits.astype(np.float64)
    log_softmax = x - np.log(np.exp(x).sum())
    got = top_logprobs(logits, 5)
    want = sorted(enumerate(log_softmax), key=lambda item: -item[1])[:5]
    assert [i for i, _ in got] == [i for i, _ in want]
    np.testing.assert_allclose([lp for _, lp in got], [lp for _, lp in want], rtol=1e-5)
    assert top_logprobs(logits, 0) == []
    assert len(top_logprobs(logits, 100)) == 50


def test_bad_params_raise():
    with pytest.raises(EdgeInferError):
        SamplingParams(repeat_penalty=0.0)
    with pytest.raises(EdgeInferError):
        SamplingParams(repeat_last_n=-2)


@pytest.mark.parametrize("first_try", [1, 4, 1024])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9, 0.999])
def test_nucleus_without_full_sort_matches_full_sort(first_try, p):
    for seed in range(5):
        logits = random_logits(seed, n_vocab=3000, scale=seed + 0.5)
        ids, candidates = top_k_candidates(logits, 0)
        n_keep = top_p_keep(candidates, p)
        got_ids, got = nucleus_candidates(logits, p, first_try=first_try)
        np.testing.assert_array_equal(got_ids, ids[:n_keep])
        np.testing.assert_array_equal(got, candidates[:n_keep])


def test_logit_bias_bans_and_boosts_greedy():
    logits = np.array([1.0, 3.0, 2.9, -1.0], dtype=np.float32)
    greedy = SamplingParams(temperature=0.0)
    banned = make_sampler(greedy, ((1, -math.inf),))
    assert banned.sample(logits, []) == 2
    boosted = make_sampler(greedy, ((3, 2.0), (3, 2.5)))
    assert boosted.sample(logits, []) == 3  # the two entries add: -1 + 4.5 > 3
    assert logits[1] == 3.0 and logits[3] == -1.0  # the caller's row is untouched


def test_logit_bias_reuses_one_scratch_buffer():
    sampler = make_sampler(SamplingParams(temperature=1.0, seed=1), ((5, -1.0),))
    logits = random_logits(3, n_vocab=64)
    first = sampler.adjusted(logits)
    assert first is not logits and first[5] == pytest.approx(logits[5] - 1.0)
    assert sampler.adjusted(random_logits(4, n_vocab=64)) is first
    plain = make_sampler(SamplingParams(temperature=1.0, seed=1))
    assert plain.adjusted(logits) is logits  # nothing to apply: no copy


def test_logit_bias_outside_the_vocabulary_raises():
    sampler = make_sampler(SamplingParams(temperature=0.0), ((64, 1.0),))
    with pytest.raises(EdgeInferError, match="outside the vocabulary"):
        sampler.sample(random_logits(0, n_vocab=64), [])
    with pytest.raises(EdgeInferError):
        make_sampler(SamplingParams(), ((-1, 1.0),))


@pytest.mark.parametrize("params", CHAINS, ids=range(len(CHAINS)))
def test_sample_with_probs_is_the_reference_distribution(params):
    logits = random_logits(params.seed, n_vocab=12, scale=1.5)
    recent = [0, 3, 3, 5, 0, 3, 7]
    bias = BIASES.get(params.seed, ())
    expected = reference_distribution(logits, recent, params, bias)
    with_probs, plain = make_sampler(params, bias), make_sampler(params, bias)
    for _ in range(20):  # the same tokens as `sample`, from the same random stream
        token, ids, probs = with_probs.sample_with_probs(logits, recent)
        assert token == plain.sample(logits, recent)
    got = {int(i): float(p) for i, p in zip(ids, probs, strict=True)}
    assert {i for i, p in got.items() if p > 0} == {i for i, p in expected.items() if p > 0}
    for token, p in expected.items():
        assert got.get(token, 0.0) == pytest.approx(p, rel=1e-5, abs=1e-9)
    top = top_probs(ids, probs, 3)
    best = sorted(((p, i) for i, p in expected.items() if p > 0), reverse=True)[:3]
    assert [i for i, _ in top] == [i for _, i in best]
    assert [p for _, p in top] == pytest.approx([p for p, _ in best], rel=1e-5)


def test_sample_with_probs_greedy_is_the_argmax():
    logits = random_logits(2, n_vocab=50)
    token, ids, probs = make_sampler(SamplingParams(temperature=0.0)).sample_with_probs(logits)
    assert token == int(np.argmax(logits)) and list(ids) == [token] and list(probs) == [1.0]


def test_top_probs_leaves_out_zero_and_clamps_k():
    ids, probs = np.array([7, 3, 9, 1]), np.array([0.25, 0.0, 0.5, 0.25])
    assert top_probs(ids, probs, 10) == [(9, 0.5), (7, 0.25), (1, 0.25)]
    assert top_probs(ids, probs, 1) == [(9, 0.5)]
    assert top_probs(ids, probs, 0) == []
