"""The attention kernel against an independent float64 numpy attention.

The reference applies the mask and softmax exactly in float64 on the same F16 cache and the
F16-rounded Q (what llama.cpp's K·Q matmul sees); the kernel's remaining differences are P
rounded to F16 (relative 2^-11 per weight) and f32 sums, hence tolerances of ~1e-3 on
outputs of order 1.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

from edgeinfer.kernels.attention import (
    KEY_BLOCK,
    attention,
    key_ranges,
    scratch_floats,
    shared_floats,
)
from edgeinfer.kernels.attention import task_address as attention_task
from edgeinfer.kernels.flash import flash_attention
from edgeinfer.kernels.flash import task_address as flash_task

ATOL = 1.5e-3
TWO_THREADS = pytest.param(2, marks=pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2,
                                                       reason="the split needs 2 threads"))


def reference(q, k_cache, v_cache, slots, positions, window, scale, round_q=True):
    """out[i, h] = softmax(scale * K q) V over cells [lo, pos] of the row's slot, float64,
    with q rounded to F16 first unless round_q is False."""
    n, n_head, hd = q.shape
    group = n_head // k_cache.shape[2]
    qr = (q.astype(np.float16) if round_q else q).astype(np.float64)
    keys = k_cache.view(np.float16).astype(np.float64)
    values = v_cache.view(np.float16).astype(np.float64)
    out = np.zeros((n, n_head, hd))
    for i, (s, p) in enumerate(zip(slots, positions)):
        lo = max(0, p - window + 1) if window > 0 else 0
        for h in range(n_head):
            x = keys[s, lo : p + 1, h // group] @ qr[i, h] * scale
            w = np.exp(x - x.max())
            out[i, h] = (w / w.sum()) @ values[s, lo : p + 1, h // group]
    return out


def make_cache(rng, n_slots, n_ctx, n_kv, hd):
    k = rng.standard_normal((n_slots, n_ctx, n_kv, hd)).astype(np.float16).view(np.uint16)
    v = rng.standard_normal((n_slots, n_ctx, n_kv, hd)).astype(np.float16).view(np.uint16)
    return k, v


def run(q, k_cache, v_cache, slots, positions, window, scale, threads=1, scratch=None,
        kernel=attention, shared=None, tables=None):
    """The kernel on fresh output; by default without `shared` scratch, so a decode split
    allocates its own, and with each slot one block of the cache (tables[s] = [s])."""
    slots, positions = np.asarray(slots, np.int32), np.asarray(positions, np.int32)
    if tables is None:
        tables = np.arange(k_cache.shape[0], dtype=np.int32).reshape(-1, 1)
    if scratch is None:
        scratch = np.zeros((numba.config.NUMBA_NUM_THREADS, k_cache.shape[1]), np.float32)
    if shared is None:
        shared = np.zeros(0, np.float32)
    out = np.full(q.shape, np.nan, np.float32)
    q_before = q.copy()
    old = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        task = (flash_task if kernel is flash_attention else attention_task)()
        kernel(q, k_cache, v_cache, slots, tables, positions, window, np.float32(scale),
               scratch, shared, out, task)
    finally:
        numba.set_num_threads(old)
    np.testing.assert_array_equal(q, q_before)  # q is read, not rounded in place
    return out


def run_split(q, k_cache, v_cache, slots, positions, window, scale, threads, kernel=attention,
              tables=None):
    """run with `shared` scratch of shared_floats(...): (out, the key ranges per row that the
    kernels' plan splits these rows into on `threads` threads, 1: none), the plan checked
    against the call: its partial results are in `shared` exactly when the plan splits."""
    n_head, hd = q.shape[1:]
    n_ctx = k_cache.shape[1] * (1 if tables is None else tables.shape[1])
    shared = np.zeros(shared_floats(n_head, hd, n_ctx, numba.config.NUMBA_NUM_THREADS),
                      np.float32)
    out = run(q, k_cache, v_cache, slots, positions, window, scale, threads, kernel=kernel,
              shared=shared, tables=tables)
    old = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        ranges = key_ranges(positions, window, n_head, k_cache.shape[2], hd, n_ctx,
                            flash=kernel is flash_attention)
    finally:
        numba.set_num_threads(old)
    assert np.any(shared != 0) == (ranges > 1), ranges
    return out, ranges


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "n_head, n_kv, hd, start, n, window",
    [
        (4, 1, 256, 0, 40, 0),  # gemma3-like: one KV head, keys span several blocks
        (9, 3, 64, 50, 37, 0),  # SmolLM2-like GQA, prefill after a cached prefix
        (6, 2, 32, 0, 150, 17),  # sliding window inside and across key blocks
        (4, 4, 16, 3, 70, 64),  # no grouping, window equal to a key block
        (8, 1, 8, 0, 9, 0),  # 8 heads per KV head: two 4-row passes per token
    ],
)
def test_prefill_matches_reference(n_head, n_kv, hd, start, n, window, threads):
    rng = np.random.default_rng(n_head * 100 + hd)
    k, v = make_cache(rng, 2, start + n + 5, n_kv, hd)
    q = rng.standard_normal((n, n_head, hd)).astype(np.float32)
    slots, positions = np.ones(n), start + np.arange(n)
    scale = 1.5 / np.sqrt(hd)
    ours = run(q, k, v, slots, positions, window, scale, threads)
    ref = reference(q, k, v, slots.astype(int), positions, window, scale)
    np.testing.assert_allclose(ours, ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("threads", [1, 2])
def test_mixed_slots_and_positions_in_one_batch(threads):
    """Continuous batching: prefill chunks and decode rows of several slots, any order."""
    rng = np.random.default_rng(7)
    k, v = make_cache(rng, 4, 300, 2, 64)
    slots = [2, 2, 2, 0, 3, 1, 1, 1, 1, 0, 2]
    positions = [10, 11, 12, 250, 0, 70, 71, 72, 73, 5, 200]
    q = rng.standard_normal((len(slots), 6, 64)).astype(np.float32)
    for window in (0, 20):
        ours = run(q, k, v, slots, positions, window, 0.125, threads)
        ref = reference(q, k, v, slots, positions, window, 0.125)
        np.testing.assert_allclose(ours, ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("threads", [1, TWO_THREADS])
@pytest.mark.parametrize("n_head, n_kv, hd, window", [(9, 3, 64, 0), (4, 1, 256, 0),
                                                       (4, 1, 256, 512)])
def test_long_context_decode(n_head, n_kv, hd, window, threads):
    """One token over thousands of cached cells (on 2 threads, unless a 512-cell window
    leaves it too few, its keys are split into ranges whose partial softmaxes are merged)."""
    rng = np.random.default_rng(hd)
    k, v = make_cache(rng, 1, 4200, n_kv, hd)
    q = rng.standard_normal((2, n_head, hd)).astype(np.float32)
    for positions in ([4150], [4150, 3000]):
        m = len(positions)
        ours, ranges = run_split(q[:m], k, v, [0] * m, positions, window, 0.1, threads)
        if m == 1:
            assert (ranges > 1) == (threads == 2 and window == 0), ranges
        ref = reference(q[:m], k, v, [0] * m, positions, window, 0.1)
        np.testing.assert_allclose(ours, ref, atol=ATOL / 4, rtol=0)


def test_peaked_softmax_with_a_rising_max():
    """Scores that grow along the context make the running max change in every key block,
    and a large scale makes the weights span many orders of magnitude."""
    rng = np.random.default_rng(3)
    n_ctx, hd = 5 * KEY_BLOCK + 7, 32
    ramp = np.linspace(0.0, 4.0, n_ctx)[None, :, None, None]
    keys = (rng.standard_normal((1, n_ctx, 1, hd)) * 0.3 + ramp).astype(np.float16)
    k = keys.view(np.uint16)
    v = rng.standard_normal((1, n_ctx, 1, hd)).astype(np.float16).view(np.uint16)
    q = np.abs(rng.standard_normal((n_ctx, 2, hd))).astype(np.float32)
    positions = np.arange(n_ctx)
    ours = run(q, k, v, np.zeros(n_ctx), positions, 0, 1.0)
    ref = reference(q, k, v, np.zeros(n_ctx, int), positions, 0, 1.0)
    np.testing.assert_allclose(ours, ref, atol=ATOL, rtol=0)


def test_decode_alone_equals_row_of_prefill_exactly():
    """Key blocks are aligned to absolute positions, so a token decoded alone computes the
    same sums in the same order as inside a prefill tile (cached decode == full forward)."""
    rng = np.random.default_rng(11)
    k, v = make_cache(rng, 1, 200, 3, 64)
    n = 150
    q = rng.standard_normal((n, 9, 64)).astype(np.float32)
    full = run(q, k, v, np.zeros(n), np.arange(n), 40, 0.125)
    for i in (0, 3, 63, 64, 65, 100, 149):
        alone = run(q[i : i + 1], k, v, [0], [i], 40, 0.125)
        np.testing.assert_array_equal(alone[0], full[i])


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="the split needs 2 threads")
@pytest.mark.parametrize("window", [0, 1500])
@pytest.mark.parametrize("position", [1023, 1200, 2600])
def test_long_row_is_the_same_bits_alone_split_or_in_a_batch(position, window):
    """A lone long decode row (its keys split across 2 threads), the same row on one thread,
    and the same row among short ones in a batch (not split) give the same bits: a server's
    answer does not depend on what else it is decoding (issue 41)."""
    rng = np.random.default_rng(position)
    k, v = make_cache(rng, 8, 2700, 3, 64)
    q = rng.standard_normal((8, 9, 64)).astype(np.float32)
    positions = [position] + [40 + 9 * i for i in range(7)]
    split, ranges = run_split(q[:1], k, v, [0], positions[:1], window, 0.125, threads=2)
    assert ranges > 1, ranges  # the lone row's keys really are split
    serial = run(q[:1], k, v, [0], positions[:1], window, 0.125, threads=1)
    batch, batch_ranges = run_split(q, k, v, list(range(8)), positions, window, 0.125, 2)
    prefill, prefill_ranges = run_split(q[:1].repeat(3, 0), k, v, [0] * 3,
                                        [position - 2, position - 1, position], window, 0.125, 2)
    assert batch_ranges == prefill_ranges == 1  # and neither of those is
    np.testing.assert_array_equal(split[0], serial[0])
    np.testing.assert_array_equal(split[0], batch[0])
    ref = reference(q[:1], k, v, [0], positions[:1], window, 0.125)
    np.testing.assert_allclose(split, ref, atol=ATOL / 4, rtol=0)
    np.testing.assert_array_equal(split[0], prefill[2])  # the last row of a prefill tile


def test_given_scratch_is_used_and_any_size_works():
    """`scores` rows of scratch_floats(...) floats avoid the per-call allocation; smaller
    ones make the kernel allocate its own, with the same result."""
    rng = np.random.default_rng(5)
    k, v = make_cache(rng, 1, 100, 3, 64)
    q = rng.standard_normal((20, 9, 64)).astype(np.float32)
    args = (q, k, v, np.zeros(20), np.arange(60, 80), 0, 0.125)
    big = np.zeros((numba.config.NUMBA_NUM_THREADS, scratch_floats(9, 3, 64, 100)), np.float32)
    tiny = np.zeros((numba.config.NUMBA_NUM_THREADS, 1), np.float32)
    with_scratch = run(*args, scratch=big)
    assert np.any(big != 0)
    np.testing.assert_array_equal(run(*args, scratch=tiny), with_scratch)


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="the split needs 2 threads")
@pytest.mark.parametrize("kernel", [attention, flash_attention], ids=["exact", "flash"])
def test_given_shared_scratch_is_used_on_the_decode_split(kernel):
    """A lone long decode row is split across threads into shared scores and partial sums:
    in `shared` when it holds shared_floats(...) floats (the model's workspace), else in
    arrays the call allocates, with the same result."""
    rng = np.random.default_rng(6)
    k, v = make_cache(rng, 1, 4200, 3, 64)
    q = rng.standard_normal((1, 9, 64)).astype(np.float32)
    args = (q, k, v, [0], [4150], 0, 0.1, 2)
    shared = np.zeros(shared_floats(9, 64, 4200, numba.config.NUMBA_NUM_THREADS), np.float32)
    given = run(*args, kernel=kernel, shared=shared)
    assert np.any(shared != 0)
    np.testing.assert_array_equal(run(*args, kernel=kernel), given)


def test_prefetch_is_a_hint_even_past_the_end():
    """Prefetching never changes data and never faults, even far outside the array."""
    from edgeinfer.kernels.prefetch import prefetch

    @numba.njit
    def touch(a):
        for j in (0, a.shape[1] - 1, a.shape[1] + 10_000):
            prefetch(a, 0, j, 0, 0)
        return a.sum()

    a = np.arange(2 * 8 * 3 * 4, dtype=np.uint16).reshape(2, 8, 3, 4)
    assert touch(a) == a.sum()
    (sig,) = touch.signatures
    assert "llvm.prefetch" in touch.inspect_llvm(sig)


def paged(rng, k_cache, v_cache, block):
    """The same cells in a pool of `block`-cell blocks, in a random order, with spare blocks
    of noise between them: (k_pool, v_pool, tables)."""
    n_slots, n_ctx = k_cache.shape[:2]
    per = n_ctx // block
    n_blocks = n_slots * per + 3
    order = rng.permutation(n_blocks)[: n_slots * per].astype(np.int32)
    tables = order.reshape(n_slots, per)
    pools = []
    for cache in (k_cache, v_cache):
        pool = rng.standard_normal((n_blocks, block) + cache.shape[2:]).astype(
            np.float16).view(np.uint16)
        for s in range(n_slots):
            for b in range(per):
                pool[tables[s, b]] = cache[s, b * block : (b + 1) * block]
        pools.append(pool)
    return pools[0], pools[1], tables


@pytest.mark.parametrize("kernel", [attention, flash_attention], ids=["plain", "flash"])
@pytest.mark.parametrize("threads", [1, TWO_THREADS])
@pytest.mark.parametrize("block", [KEY_BLOCK, 2 * KEY_BLOCK, 4 * KEY_BLOCK])
@pytest.mark.parametrize(
    "n_head, n_kv, hd, positions, slots, window",
    [
        (9, 3, 64, list(range(100, 180)), [1] * 80, 0),  # prefill after a cached prefix
        (4, 1, 256, [700, 5, 511, 256], [0, 1, 2, 3], 0),  # batched decode, 4 sequences
        (6, 2, 32, list(range(0, 300)), [2] * 300, 100),  # sliding window across blocks
        (8, 2, 16, [1023], [3], 0),  # one long decode row: split across threads
    ],
)
def test_paged_cache_is_bit_for_bit_the_contiguous_one(kernel, threads, block, n_head, n_kv,
                                                       hd, positions, slots, window):
    """Reading the cells through out-of-order block tables gives the same bits as reading
    them from one contiguous run per slot."""
    rng = np.random.default_rng(block + hd)
    k, v = make_cache(rng, 4, 1024, n_kv, hd)
    q = rng.standard_normal((len(positions), n_head, hd)).astype(np.float32)
    k_pool, v_pool, tables = paged(rng, k, v, block)
    args = (slots, positions, window, 0.125, threads)
    contiguous, ranges = run_split(q, k, v, *args, kernel=kernel)
    through_tables, paged_ranges = run_split(q, k_pool, v_pool, *args, kernel=kernel,
                                             tables=tables)
    np.testing.assert_array_equal(through_tables, contiguous)
    assert paged_ranges == ranges
    if len(positions) == 1:  # the long decode row
        assert (ranges > 1) == (threads == 2), ranges


def test_store_kv_writes_through_the_block_tables():
    from edgeinfer.kernels.attention import store_kv

    rng = np.random.default_rng(7)
    n_kv, hd, block = 2, 8, 64
    k_pool = np.zeros((6, block, n_kv, hd), np.uint16)
    v_pool = np.zeros_like(k_pool)
    tables = np.array([[4, 1, 3], [0, 5, 2]], np.int32)
    slots, positions = np.array([0, 0, 1, 1], np.int32), np.array([0, 130, 64, 191], np.int32)
    k = rng.standard_normal((4, n_kv, hd)).astype(np.float32)
    v = rng.standard_normal((4, n_kv, hd)).astype(np.float32)
    store_kv(k, v, slots, tables, positions, k_pool, v_pool)
    for i, (s, p) in enumerate(zip(slots, positions)):
        blk, row = tables[s, p // block], p % block
        np.testing.assert_array_equal(k_pool[blk, row], k[i].astype(np.float16).view(np.uint16))
        np.testing.assert_array_equal(v_pool[blk, row], v[i].astype(np.float16).view(np.uint16))
    assert np.count_nonzero(k_pool.any(axis=(2, 3))) == 4  # nothing else written
