"""Attention over the device F16 KV cache.

`rope_store` takes each token's fresh q, k, v (one fused projection output) through the
per-head RMSNorm (qwen3, gemma3), rope (adjacent pairs or neox halves) and q's prescale, and
writes k, v into the cache at the token's position, through its slot's block table.
`attention` runs online softmax
(one pass over the keys, 32 at a time: a running max and sum) for one (head, token) per warp;
decode and prefill are the same kernel, each token seeing cells [lo, pos] of its slot, where
lo = pos - window + 1 on sliding-window layers.

Cache layout (n_blocks, n_kv, B, hd) float16 per layer, the host cache's blocks (model.KVCache):
cell p of slot s is row p % B of block tables[s, p // B]; a head's keys in a block are one run.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from edgeinfer.cuda.kernels.matmul import round_half_away
from edgeinfer.cuda.kernels.prims import WARP, block_max, block_sum, to_i32

MAX_HD = 256  # head dims a warp's registers hold
PER_LANE = MAX_HD // WARP  # (8 per lane; array shapes must be constants)


@cuda.jit(device=True)
def _rope_row(row, t, src0, dst, dst_t, dst_h, pos, cos, sin, neox, n_rot, scale, hd, lane):
    """dst[dst_t, dst_h, :] = rope(row[t, src0 : src0 + hd] * scale), a thread per pair."""
    half = n_rot // 2
    for p in range(lane, half, WARP):
        i, j = (p, p + half) if neox else (2 * p, 2 * p + 1)
        a, b = row[t, src0 + i] * scale, row[t, src0 + j] * scale
        c, s = cos[pos, p], sin[pos, p]
        dst[dst_t, dst_h, i] = a * c - b * s
        dst[dst_t, dst_h, j] = a * s + b * c
    for i in range(n_rot + lane, hd, WARP):
        dst[dst_t, dst_h, i] = row[t, src0 + i] * scale


@cuda.jit
def rope_store(qkv, q_norm, k_norm, eps, cos, sin, neox, n_rot, q_scale, positions, slots,
               tables, q_out, k_scratch, k_cache, v_cache):
    """Head h = blockIdx.x of token t = blockIdx.y, 32 threads: q heads first, then kv heads.
    qkv (n, (n_head + 2 n_kv) hd); q_out (n, n_head, hd); k_scratch (n, n_kv, hd) f32;
    tables (n_slots, n_ctx / B) int32; k_cache, v_cache (n_blocks, n_kv, B, hd) f16."""
    h, t, lane = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
    red = cuda.shared.array(WARP, np.float32)
    n_head, hd = q_out.shape[1], q_out.shape[2]
    is_q = h < n_head
    src0 = h * hd if is_q else n_head * hd + (h - n_head) * hd
    norm_w = q_norm if is_q else k_norm
    scale = np.float32(1)
    if norm_w.shape[0]:
        ss = np.float32(0)
        for i in range(lane, hd, WARP):
            ss += qkv[t, src0 + i] * qkv[t, src0 + i]
        ss = block_sum(ss, red, lane, WARP)
        scale = np.float32(1) / math.sqrt(ss / hd + eps)
    pos = positions[t]
    if is_q:
        if norm_w.shape[0]:
            for i in range(lane, hd, WARP):  # normed in place before the pairs mix dims
                qkv[t, src0 + i] = qkv[t, src0 + i] * scale * norm_w[i]
            cuda.syncthreads()
        _rope_row(qkv, t, src0, q_out, t, h, pos, cos, sin, neox, n_rot, q_scale, hd, lane)
        return
    kvh = h - n_head
    if norm_w.shape[0]:
        for i in range(lane, hd, WARP):
            qkv[t, src0 + i] = qkv[t, src0 + i] * scale * norm_w[i]
        cuda.syncthreads()
    _rope_row(qkv, t, src0, k_scratch, t, kvh, pos, cos, sin, neox, n_rot, np.float32(1),
              hd, lane)
    cuda.syncthreads()
    v0, bs = n_head * hd + (k_scratch.shape[1] + kvh) * hd, k_cache.shape[2]
    blk, row = tables[slots[t], pos // bs], pos % bs
    for i in range(lane, hd, WARP):
        k_cache[blk, kvh, row, i] = k_scratch[t, kvh, i]
        v_cache[blk, kvh, row, i] = qkv[t, v0 + i]


@cuda.jit(device=True)
def _quantize_lanes(v, t, b, lane, red, scratch, xq, xd, xs):
    """The warp's 32 values (one per lane) as Q8_1 block b of token t (matmul.py's
    quantize_block, across lanes): scratch holds the int8s while 8 lanes pack them."""
    amax = block_max(abs(v), red, lane, WARP)
    d = amax / np.float32(127)
    q = int(round_half_away(v * (np.float32(1) / d))) if d > 0 else 0
    total = block_sum(np.float32(q), red, lane, WARP)
    scratch[lane] = q
    cuda.syncthreads()
    if lane < 8:
        packed = 0
        for i in range(4):
            packed |= (int(scratch[4 * lane + i]) & 0xFF) << (8 * i)
        xq[t, 8 * b + lane] = to_i32(packed)
    if lane == 0:
        xd[t, b] = d
        xs[t, b] = d * total
    cuda.syncthreads()


@cuda.jit
def attention(q, k_cache, v_cache, slots, tables, positions, window, score_scale, out, xq, xd,
              xs):
    """out[t, h] = softmax(q[t, h] . K^T * score_scale) . V over the token's visible cells;
    head h = blockIdx.x, token t = blockIdx.y, one warp. q (n, n_head, hd) f32,
    out (n, n_head * hd) f32; and, when xq has rows (hd a multiple of 32), out's Q8_1 blocks
    for the output projection, each block 32 dims of one head: one launch fewer a layer."""
    h, t, lane = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
    red = cuda.shared.array(WARP, np.float32)
    probs = cuda.shared.array(WARP, np.float32)
    qs = cuda.shared.array(MAX_HD, np.float32)
    acc = cuda.local.array(PER_LANE, np.float32)
    n_head, hd, n_kv = q.shape[1], q.shape[2], k_cache.shape[1]
    kvh, tbl, pos = h // (n_head // n_kv), tables[slots[t]], positions[t]
    bs = k_cache.shape[2]
    for i in range(lane, hd, WARP):
        qs[i] = q[t, h, i]
    for r in range(PER_LANE):
        acc[r] = 0
    cuda.syncthreads()
    lo = max(0, pos - window + 1) if window > 0 else 0
    m, total = np.float32(-np.inf), np.float32(0)
    for c0 in range(lo, pos + 1, WARP):
        key = c0 + lane
        s = np.float32(-np.inf)
        if key <= pos:
            s = np.float32(0)
            blk, row = tbl[key // bs], key % bs
            for i in range(hd):
                s += qs[i] * np.float32(k_cache[blk, kvh, row, i])
            s *= score_scale
        m_new = max(m, block_max(s, red, lane, WARP))
        corr = math.exp(m - m_new)
        p = math.exp(s - m_new) if key <= pos else np.float32(0)
        total = total * corr + block_sum(p, red, lane, WARP)
        probs[lane] = p
        cuda.syncthreads()
        n_keys = min(WARP, pos + 1 - c0)
        for r in range(PER_LANE):
            d = lane + WARP * r
            if d < hd:
                a = acc[r] * corr
                for j in range(n_keys):
                    cell = c0 + j
                    a += probs[j] * np.float32(v_cache[tbl[cell // bs], kvh, cell % bs, d])
                acc[r] = a
        cuda.syncthreads()
        m = m_new
    quantize = xq.shape[0] > 0
    for r in range(PER_LANE):
        d = lane + WARP * r
        if d < hd:
            out[t, h * hd + d] = acc[r] / total
        if quantize and WARP * r < hd:  # the whole warp: 32 dims, one Q8_1 block
            _quantize_lanes(acc[r] / total, t, (h * hd + WARP * r) // WARP, lane, red, qs,
                            xq, xd, xs)
