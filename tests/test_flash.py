"""The flash-attention kernel against independent references.

- Calls of >= 64 query tokens take llama.cpp's f32 path: against float64 attention on the
  same F16 cache and the unrounded Q (what that path sees), to ~1e-6.
- Fewer take its F16 path: against a numpy transcript of ggml's one-chunk loop (Q rounded
  to F16, key by key, the accumulator rounded to F16 after each key and each rescale). Only
  dot-product orders and exp's last bit differ: all but a few outputs agree within 1e-4
  (the rest where one F16 rounding went the other way: within an F16 step), while the same
  loop without the F16 rounding differs by more than 1e-4 in about half of them.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from test_attention import TWO_THREADS, make_cache, reference, run_split
from test_attention import run as run_kernel

from edgeinfer.kernels.attention import KEY_BLOCK
from edgeinfer.kernels.flash import FA_TILE_Q, flash_attention, flash_scratch_floats

F32_ATOL = 2e-5
F16_CLOSE, F16_STEP = 1e-4, 2e-3  # most outputs / all (an F16 ulp flip at |x| < 2)


def assert_f16_path(ours, transcript):
    diff = np.abs(ours - transcript)
    assert diff.max() <= F16_STEP, diff.max()
    assert (diff > F16_CLOSE).mean() < 0.005, (diff > F16_CLOSE).mean()


def one_chunk_transcript(q, k_cache, v_cache, slots, positions, window, scale, round_acc=True):
    """ggml_compute_forward_flash_attn_ext_f16_one_chunk for F16 K and V, in numpy float32."""
    n, n_head, hd = q.shape
    group = n_head // k_cache.shape[2]
    f32 = np.float32
    keys = k_cache.view(np.float16).astype(np.float64)
    values = v_cache.view(np.float16).astype(f32)
    to_f16 = (lambda a: a.astype(np.float16).astype(f32)) if round_acc else (lambda a: a)
    out = np.zeros((n, n_head, hd), f32)
    for i, (s, p) in enumerate(zip(slots, positions)):
        lo = max(0, p - window + 1) if window > 0 else 0
        for h in range(n_head):
            q16 = q[i, h].astype(np.float16).astype(np.float64)
            acc, m, total = np.zeros(hd, f32), f32(-np.inf), f32(0.0)
            for j in range(lo, p + 1):
                x = f32(f32(keys[s, j, h // group] @ q16) * f32(scale))
                ms = vs = f32(1.0)
                if x > m:
                    ms, m = np.exp(f32(m - x)), x
                    acc = to_f16(acc * ms)
                else:
                    vs = np.exp(f32(x - m))
                acc = to_f16(acc + values[s, j, h // group] * vs)
                total = f32(total * ms + vs)
            out[i, h] = acc * (f32(1.0) / total)
    return out


def run(q, k_cache, v_cache, slots, positions, window, scale, threads=1, scratch=None):
    """test_attention's runner on flash_attention; by default with a scratch too small, so
    the kernel allocates its own."""
    if scratch is None:
        scratch = np.zeros((numba.config.NUMBA_NUM_THREADS, 1), np.float32)
    return run_kernel(q, k_cache, v_cache, slots, positions, window, scale, threads, scratch,
                      kernel=flash_attention)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "n_head, n_kv, hd, start, n, window",
    [
        (4, 1, 256, 0, 70, 0),  # gemma3-like: one KV head, keys span several blocks
        (9, 3, 64, 50, 90, 0),  # SmolLM2-like GQA, prefill after a cached prefix
        (6, 2, 32, 0, 150, 17),  # sliding window inside and across key blocks
        (4, 4, 16, 3, 64, 64),  # exactly FA_TILE_Q tokens, window equal to a key block
    ],
)
def test_prefill_f32_path_matches_reference(n_head, n_kv, hd, start, n, window, threads):
    assert n >= FA_TILE_Q
    rng = np.random.default_rng(n_head * 100 + hd)
    k, v = make_cache(rng, 2, start + n + 5, n_kv, hd)
    q = rng.standard_normal((n, n_head, hd)).astype(np.float32)
    slots, positions = np.ones(n, int), start + np.arange(n)
    scale = 1.5 / np.sqrt(hd)
    ours = run(q, k, v, slots, positions, window, scale, threads)
    np.testing.assert_allclose(ours, reference(q, k, v, slots, positions, window, scale, False),
                               atol=F32_ATOL, rtol=0)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("window", [0, 20])
def test_batched_decode_f16_path_matches_ggml_transcript(window, threads):
    """Continuous batching (rows of several slots at any positions, a short prefill run
    among them): fewer than 64 tokens, so the F16-accumulator path."""
    rng = np.random.default_rng(1)
    k, v = make_cache(rng, 3, 400, 3, 64)
    slots = [0, 1, 0, 1, 2, 2, 2, 1, 0]
    positions = [300, 250, 200, 10, 64, 65, 66, 63, 128]
    q = rng.standard_normal((len(slots), 9, 64)).astype(np.float32)
    ours = run(q, k, v, slots, positions, window, 0.125, threads)
    assert_f16_path(ours, one_chunk_transcript(q, k, v, slots, positions, window, 0.125))
    unrounded = one_chunk_transcript(q, k, v, slots, positions, window, 0.125, round_acc=False)
    assert (np.abs(ours - unrounded) > F16_CLOSE).mean() > 0.2  # the F16 rounding is there
    exact = reference(q, k, v, slots, positions, window, 0.125, True)
    np.testing.assert_allclose(ours, exact, atol=5e-3, rtol=0)


def test_gemma_like_decode_f16_path():
    rng = np.random.default_rng(2)
    k, v = make_cache(rng, 2, 300, 1, 256)
    q = rng.standard_normal((2, 4, 256)).astype(np.float32)
    ours = run(q, k, v, [0, 1], [299, 130], 0, 0.0625)
    assert_f16_path(ours, one_chunk_transcript(q, k, v, [0, 1], [299, 130], 0, 0.0625))


@pytest.mark.parametrize("threads", [1, TWO_THREADS])
def test_long_context_decode_split_keys(threads):
    """One token over 4150 cached cells: on 2 threads its keys are split into ranges whose
    (max, sum, accumulator) parts are merged as ggml's reduce_partials does."""
    rng = np.random.default_rng(64)
    k, v = make_cache(rng, 1, 4200, 3, 64)
    q = rng.standard_normal((1, 9, 64)).astype(np.float32)
    ours, ranges = run_split(q, k, v, [0], [4150], 0, 0.1, threads, kernel=flash_attention)
    assert (ranges > 1) == (threads == 2), ranges  # the keys really are split on 2 threads
    # F16 accumulation over thousands of keys: error grows with the row, not the split
    np.testing.assert_allclose(ours, reference(q, k, v, [0], [4150], 0, 0.1, True), atol=3e-3,
                               rtol=0)
    if threads == 1:
        assert_f16_path(ours, one_chunk_transcript(q, k, v, [0], [4150], 0, 0.1))


@pytest.mark.parametrize("n_tokens", [8, 70])
def test_rising_max_rescales_the_accumulator(n_tokens):
    """Scores that grow along the context raise the running max in every key block, with
    weights spanning many orders of magnitude: both paths' rescaling is exercised."""
    rng = np.random.default_rng(3)
    n_ctx, hd = 5 * KEY_BLOCK + 7, 32
    ramp = np.linspace(0.0, 4.0, n_ctx)[None, :, None, None]
    k = (rng.standard_normal((1, n_ctx, 1, hd)) * 0.3 + ramp).astype(np.float16).view(np.uint16)
    v = rng.standard_normal((1, n_ctx, 1, hd)).astype(np.float16).view(np.uint16)
    q = np.abs(rng.standard_normal((n_tokens, 2, hd))).astype(np.float32)
    positions = n_ctx - n_tokens + np.arange(n_tokens)
    slots = np.zeros(n_tokens, int)
    ours = run(q, k, v, slots, positions, 0, 1.0)
    if n_tokens < FA_TILE_Q:
        assert_f16_path(ours, one_chunk_transcript(q, k, v, slots, positions, 0, 1.0))
    else:
        np.testing.assert_allclose(ours, reference(q, k, v, slots, positions, 0, 1.0, False),
                                   atol=F32_ATOL, rtol=0)


def test_given_scratch_is_used_and_any_size_works():
    rng = np.random.default_rng(5)
    k, v = make_cache(rng, 1, 100, 3, 64)
    q = rng.standard_normal((20, 9, 64)).astype(np.float32)
    args = (q, k, v, np.zeros(20), np.arange(60, 80), 0, 0.125)
    big = np.zeros((numba.config.NUMBA_NUM_THREADS, flash_scratch_floats(9, 3, 64)), np.float32)
    with_scratch = run(*args, scratch=big)
    assert np.any(big != 0)
    np.testing.assert_array_equal(run(*args), with_scratch)
