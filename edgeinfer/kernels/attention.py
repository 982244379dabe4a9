"""Causal grouped-query attention over the F16 KV cache.

One kernel serves prefill (many tokens of one sequence) and batched decode (one token of each
of several sequences): every query row carries its own cache slot and absolute position, and
attends to cache cells [lo, pos] of that slot, where lo = pos - window + 1 on sliding-window
layers (shared/docs/architectures.md §1.3, "Mask").

Numerics mirror llama.cpp's non-flash path (build_attn_mha), which produced the golden
files: Q rounded to F16 for the F16 K·Q product, f32 accumulation, softmax of x*scale with
the sum in double, P rounded to F16 for the F16 P·V product.
"""

from __future__ import annotations

import numpy as np
from numba import get_thread_id, njit, prange

from edgeinfer.kernels.f16 import f16_bits_to_f32, f32_to_f16_bits, round_f16


# Reassociation lets LLVM vectorize the q.k reduction (strict f32 order keeps it scalar);
# llama.cpp's SIMD dot products reorder their sums the same way.
FAST = {"reassoc", "contract"}


@njit(parallel=True, cache=True, fastmath=FAST)
def attention(q, k_cache, v_cache, slots, positions, window, scale, scores, out):
    """q (n, n_head, hd) f32, rounded to F16 in place; k_cache/v_cache (n_slots, n_ctx,
    n_kv, hd) uint16 F16 bits; slots/positions (n,) int32; scores (n_threads, n_ctx) f32
    scratch; out (n, n_head, hd) f32."""
    n, n_head, hd = q.shape
    group = n_head // k_cache.shape[2]
    for t in prange(n * n_head):
        i, h = t // n_head, t % n_head
        kvh, s, p = h // group, slots[i], positions[i]
        lo = max(0, p - window + 1) if window > 0 else 0
        row = scores[get_thread_id()]
        for d in range(hd):
            q[i, h, d] = round_f16(q[i, h, d])
        top = np.float32(-np.inf)
        for j in range(lo, p + 1):
            acc = np.float32(0.0)
            for d in range(hd):
                acc += q[i, h, d] * f16_bits_to_f32(k_cache[s, j, kvh, d])
            row[j] = acc * scale
            top = max(top, row[j])
        total = 0.0
        for j in range(lo, p + 1):
            e = np.exp(row[j] - top)
            row[j] = e
            total += e
        inv = np.float32(1.0 / total)
        for d in range(hd):
            out[i, h, d] = 0.0
        for j in range(lo, p + 1):
            pj = round_f16(row[j] * inv)
            for d in range(hd):
                out[i, h, d] += pj * f16_bits_to_f32(v_cache[s, j, kvh, d])


@njit(cache=True)
def store_kv(k, v, slots, positions, k_cache, v_cache):
    """Write this batch's K and V (n, n_kv, hd) f32 into the cache as F16, before attention
    reads them (llama.cpp copies into the cache first, so the current token is F16 too)."""
    n, n_kv, hd = k.shape
    for i in range(n):
        s, p = slots[i], positions[i]
        for h in range(n_kv):
            for d in range(hd):
                k_cache[s, p, h, d] = f32_to_f16_bits(k[i, h, d])
                v_cache[s, p, h, d] = f32_to_f16_bits(v[i, h, d])

